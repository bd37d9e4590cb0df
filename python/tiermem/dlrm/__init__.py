"""DLRM, the application tiermem's embedding tables serve: the model (:mod:`.model`), its
trainer with checkpoints (:mod:`.trainer`), the data it reads (:mod:`.data`: synthetic and
Criteo), and the runs and reports of ``tiermem train dlrm`` and ``tiermem demo``
(:mod:`.report`). Needs PyTorch."""
