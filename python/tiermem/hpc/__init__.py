"""HPC kernels over tiered arrays (:mod:`.kernels`, run by ``tiermem-hpc``), CRS matrices with
the structures of Arima & Schulz's Table 2 (:mod:`.matrices`), and pattern-aware staging:
the break-even line and its calibration (:mod:`.staging`)."""
