"""Training data for recommendation models: a synthetic generator with a learnable signal
and a streaming reader for the Criteo display-advertising TSV format."""

from .batch import Batch
from .criteo import CriteoFormatError, CriteoReader, line_ranges, write_criteo
from .synthetic import SyntheticData

__all__ = ["Batch", "SyntheticData", "CriteoReader", "CriteoFormatError", "line_ranges", "write_criteo"]
