"""Private utilities: one validation vocabulary, atomic files, flags, progress."""
