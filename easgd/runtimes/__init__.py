"""Real asynchronous workers: the shared programs and center, the driver, threads, Ray."""
