"""What the command line and the benchmarks show and keep: tables and progress bars (``rich``,
imported lazily), plots (``matplotlib``), the machine's load around a measurement, JSON
outputs and scratch directories. Below :mod:`tiermem.cli` and :mod:`tiermem.bench`, above
the library; it imports neither of them."""
