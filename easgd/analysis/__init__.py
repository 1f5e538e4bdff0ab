"""Theory: analytic stability and the largest Hessian eigenvalue."""
