"""PyTorch modules over tiered embedding tables.

:class:`TieredEmbeddingBag` takes ``torch.nn.EmbeddingBag``'s constructor arguments and
forward signature, plus where its rows live and which cache policy runs. Its optimizer is
fused into backward (as FBGEMM's table-batched embeddings do): ``loss.backward()`` updates
the rows in place, so the table is not in ``parameters()`` and needs no ``optimizer.step()``.
:class:`TieredEmbeddingBagCollection` looks up many tables in one kernel call.

Importing this module imports torch; ``import tiermem`` alone never does.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from ..embedding import EmbeddingCollection, EmbeddingTable, OptimizerConfig, Placement, as_bags
from ..exceptions import InvalidArgumentError, TiermemError
from ..manager import Manager

__all__ = ["TieredEmbeddingBag", "TieredEmbeddingBagCollection"]


def _np_i64(t: Any, what: str) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        if t.dtype not in (torch.int64, torch.int32):
            raise InvalidArgumentError(f"{what} must be int64 or int32, not {t.dtype}")
        return t.detach().to(torch.int64).contiguous().numpy()
    arr = np.asarray(t)
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what} must be integers, not {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _bags(input: Any, offsets: Any, include_last_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    return as_bags(_np_i64(input, "input"), None if offsets is None else _np_i64(offsets, "offsets"), include_last_offset)


def _table_where(where: str | int | None, k: int, n: int) -> str | int | None:
    """Table ``k``'s ``where`` of ``n``: ``"table:PATH"`` (or ``"block:PATH"``) for several
    tables names a directory (table ``k`` in ``PATH/table{k}.tmb``), ``"file:PATH"`` likewise
    (``PATH/table{k}.rows``); anything else is every table's."""
    if n > 1 and isinstance(where, str):
        for prefix, ext in (("table:", "tmb"), ("block:", "tmb"), ("file:", "rows")):
            if where.startswith(prefix):
                return f"{prefix}{os.path.join(where[len(prefix) :], f'table{k}.{ext}')}"
    return where


def _placement(
    placement: Placement | None,
    torch_dtype: torch.dtype | None,
    where: str | int | None,
    cache: float | None,
    cacheslack: float | None,
    policy: str | None,
    admission: str | None,
) -> Placement:
    """The modules' placement: the one given, or one built from the loose keywords (those
    not ``None``); both at once is an error, as is a dtype that contradicts the placement's."""
    dtype = None if torch_dtype is None else _storage(torch_dtype)
    loose = {"device": where, "cache": cache, "cacheslack": cacheslack, "policy": policy, "admission": admission}
    given: dict[str, Any] = {k: v for k, v in loose.items() if v is not None}
    if placement is None:
        if dtype is not None:
            given["dtype"] = dtype
        return Placement(**given).validate()
    if given:
        raise InvalidArgumentError(f"pass the placement's settings in placement=, not also as {sorted(given)}")
    if dtype is not None and dtype != placement.storage_dtype:
        raise InvalidArgumentError(f"dtype {dtype} contradicts the placement's {placement.storage_dtype}")
    return placement.validate()


#: Each storage type of :data:`~tiermem.embedding.DTYPES` as a torch dtype.
TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _storage(dtype: torch.dtype | None) -> str:
    if dtype is None:
        return "float32"
    dt = {v: k for k, v in TORCH_DTYPES.items()}.get(dtype)
    if dt is None:
        raise InvalidArgumentError(f"dtype {dtype}: supported are {', '.join(map(str, TORCH_DTYPES.values()))}")
    return dt


_LIKE: dict[tuple[type, ...], type] = {}


def _torch_like(e: Exception, *also: type[BaseException]) -> Exception:
    """``e`` as an instance of a class deriving from its own and from ``also`` (the types
    ``torch.nn.EmbeddingBag`` raises for the same mistake), so code catching torch's types
    still catches tiermem's."""
    bases = tuple(dict.fromkeys((type(e), *also)))
    cls = _LIKE.get(bases)
    if cls is None:
        cls = _LIKE[bases] = type(type(e).__name__, bases, {"__module__": type(e).__module__})
    return cls(*e.args)


def _check_psw_mode(w: Any, mode: str) -> None:
    """Per-sample weights only with ``mode="sum"``; torch raises ``NotImplementedError``
    for the other modes, so this error derives from it too (it is not a missing feature of
    tiermem's: torch's ``EmbeddingBag`` has no weighted mean either)."""
    if w is not None and mode != "sum":
        raise _torch_like(
            InvalidArgumentError("per_sample_weights need mode='sum' (as torch.nn.EmbeddingBag requires)"), NotImplementedError
        )


def _check_psw(w: Any, input: Any, dtype: torch.dtype, rows: torch.dtype | None = None) -> None:
    """torch's rules: the same shape as ``input``, and the module's dtype (or its rows'
    dtype, ``rows``: a bfloat16 module's weights may be bfloat16, as torch's are)."""
    if isinstance(w, torch.Tensor) and isinstance(input, torch.Tensor):
        if tuple(w.shape) != tuple(input.shape):
            raise _torch_like(
                InvalidArgumentError(
                    f"per_sample_weights has shape {tuple(w.shape)}, but input has shape {tuple(input.shape)}: "
                    "they must be the same"
                ),
                RuntimeError,
            )
        if w.dtype not in (dtype, rows):
            raise _torch_like(
                InvalidArgumentError(
                    f"per_sample_weights are {w.dtype}, the module computes in {dtype}: they must match "
                    "(as torch.nn.EmbeddingBag requires)"
                ),
                RuntimeError,
            )


def _psw(w: Any) -> np.ndarray | None:
    if w is None:
        return None
    if isinstance(w, torch.Tensor):
        if w.requires_grad:
            raise InvalidArgumentError(
                "per_sample_weights that require grad are not supported (the optimizer is fused "
                "into backward and returns no gradient for them); pass them detached"
            )
        w = w.detach().to(torch.float32).contiguous().numpy()
    return np.ascontiguousarray(w, np.float32).reshape(-1)


def _randn_rows(t: EmbeddingTable, seed: int | None, g: Any = None) -> None:
    """Fill a table from ``N(0, 1)`` in 64 MiB chunks; zero its padding row."""
    if g is None and seed is not None:
        g = torch.Generator().manual_seed(seed)
    chunk = max(1, (64 << 20) // (4 * t.embedding_dim))
    for start in range(0, t.num_embeddings, chunk):
        n = min(chunk, t.num_embeddings - start)
        t.load(torch.randn(n, t.embedding_dim, generator=g).numpy(), start)
    if t.padding_idx is not None:
        t.load(np.zeros((1, t.embedding_dim), np.float32), t.padding_idx)


class _Lookup(torch.autograd.Function):
    """Forward: ensemble lookup. Backward: the fused update (returns no gradients)."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, owner: Any, bags: Any, weights: Any) -> torch.Tensor:
        ctx.owner, ctx.bags, ctx.weights = owner, bags, weights
        out = owner._collection.lookup(bags, weights, mode=owner._kernel_mode)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        g = grad.detach().to(torch.float32).contiguous().numpy()
        ctx.owner._fused_update(ctx.bags, g, ctx.weights)
        return None, None, None, None


def _settings(lr: float, eps: float | None, lr_decay: float, initial_accumulator_value: float, nt_stores: bool) -> dict[str, Any]:
    """The optimizer keywords that differ from :class:`OptimizerConfig`'s defaults (so a
    module given a config and no keywords passes none)."""
    given = {
        "lr": lr,
        "eps": eps,
        "lr_decay": lr_decay,
        "initial_accumulator_value": initial_accumulator_value,
        "nt_stores": nt_stores,
    }
    default = OptimizerConfig()
    return {k: v for k, v in given.items() if v != getattr(default, k)}


_INITS = ("auto", "overwrite")


def _check_init(init: str) -> None:
    if init not in _INITS:
        raise InvalidArgumentError(f"init={init!r}: use 'auto' (keep an existing table file's rows) or 'overwrite'")


def _rows_to_initialise(t: EmbeddingTable, optim: OptimizerConfig, init: str, *, given: bool) -> bool:
    """Whether a module initialises ``t``'s rows: always a new table's; a re-attached table
    file's only with ``init="overwrite"`` (its optimizer state is forgotten then). A file
    trained with another optimizer than the module's is refused, naming both."""
    if not t.attached:
        return True
    if init == "overwrite":
        t.reset_optimizer()
        return True
    if given:
        raise InvalidArgumentError(
            f"the table file {t.path} exists and holds trained rows; _weight would overwrite them: pass "
            "init='overwrite' to replace them, or leave _weight out to resume from the file"
        )
    trained = t.trained_with
    if trained is not None and trained != optim.name:
        raise InvalidArgumentError(
            f"the table file {t.path} was trained with optimizer {trained!r} (state in {t.path}.optim); this module "
            f"uses {optim.name!r}: pass optimizer={trained!r} to train on, or init='overwrite' to start over"
        )
    return False


class _FusedOptimizer:
    """Optimizer settings shared by the modules."""

    _collection: EmbeddingCollection
    mode: str

    def _init_optimizer(self, optimizer: str | OptimizerConfig, **settings: Any) -> None:
        #: The fused optimizer (validated once, here).
        self.optim = OptimizerConfig.of(optimizer, **settings)
        self.optimizer = self.optim.name
        self.lr = self.optim.lr
        self.eps = self.optim.eps
        self.lr_decay = self.optim.lr_decay
        self.initial_accumulator_value = self.optim.initial_accumulator_value
        self.nt_stores = self.optim.nt_stores
        # The graph needs a tensor that requires grad to reach backward; it is not a
        # parameter (the tables update themselves) and is not saved.
        self._anchor = torch.zeros((), requires_grad=True)
        self._frozen = False
        self._out_dtype = torch.float32

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """``requires_grad_(False)`` freezes the rows (backward no longer updates them), as it
        freezes ``torch.nn.EmbeddingBag.weight``; ``True`` thaws them."""
        self._frozen = not requires_grad
        return torch.nn.Module.requires_grad_(cast(torch.nn.Module, self), requires_grad)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``.to()``, ``.cpu()``, ``.float()``, ``.double()``, ``.half()`` (on the module or any
        model holding it): rows stay in their tiers in their storage type; the lookup's output
        takes the floating dtype asked for. A GPU device is refused: tiered tables run on the
        CPU."""
        probe = fn(torch.zeros(1, dtype=torch.float32))
        if probe.device.type != "cpu":
            raise _torch_like(
                InvalidArgumentError(
                    f"{type(self).__name__} cannot move to {probe.device}: tiered tables run on the CPU "
                    "(their rows live in the manager's tiers); keep this module on the CPU"
                ),
                RuntimeError,
            )
        if probe.dtype.is_floating_point:
            self._out_dtype = probe.dtype
        return torch.nn.Module._apply(cast(torch.nn.Module, self), fn, recurse)

    @property
    def _kernel_mode(self) -> str:
        """The kernels' mode: ``max`` pools in torch over the rows the kernels gather
        (``none``: one row per index), so its gradient reaches the arg-max rows as torch's."""
        return "none" if self.mode == "max" else self.mode

    def _output(self, bags: Any, weights: Any) -> torch.Tensor:
        if self._frozen or not torch.is_grad_enabled():
            out = torch.from_numpy(self._collection.lookup(bags, weights, mode=self._kernel_mode))
        else:
            out = _Lookup.apply(self._anchor, self, bags, weights)
        if self.mode == "max":
            out = _max_pool(out, bags[0], self._collection.tables[0].padding_idx)
        return out if self._out_dtype == torch.float32 else out.to(self._out_dtype)

    def _fused_update(self, bags: Any, grad: np.ndarray, weights: Any) -> None:
        if self._frozen:
            return
        self._collection.update(bags, grad, weights, mode=self._kernel_mode, optimizer=self.optim)


def _max_pool(rows: torch.Tensor, bag: tuple[np.ndarray, np.ndarray], padding_idx: int | None) -> torch.Tensor:
    """Each bag's column-wise maximum of its ``rows`` (one per index) by torch's own
    ``embedding_bag``: an empty bag is zeros, the padding row is left out, ties and the
    gradient go where torch sends them."""
    values, offsets = bag
    n = len(values)
    positions = torch.arange(n)
    pad = None
    if padding_idx is not None:
        pad = n
        positions[torch.from_numpy(values == padding_idx)] = n
        rows = torch.cat([rows, rows.new_zeros(1, rows.shape[1])])
    return torch.nn.functional.embedding_bag(
        positions, rows, torch.from_numpy(offsets), mode="max", include_last_offset=True, padding_idx=pad
    )


def _renorm(t: EmbeddingTable, values: np.ndarray, max_norm: float, norm_type: float) -> None:
    """``torch.embedding_renorm_`` on the rows ``values`` names: each whose ``norm_type``
    norm exceeds ``max_norm`` is scaled to it (``max_norm / (norm + 1e-7)``, torch's), in the
    table, before the lookup reads it. Only the rows that change are written."""
    idx = np.unique(values)
    if t.padding_idx is not None:
        idx = idx[idx != t.padding_idx]
    if not len(idx):
        return
    rows = t.lookup(idx, mode="none")
    norms = np.linalg.norm(rows.astype(np.float64), ord=norm_type, axis=1)
    for k in np.flatnonzero(norms > max_norm):
        scale = np.float32(max_norm / (norms[k] + 1e-7))
        t.load(rows[k : k + 1] * scale, int(idx[k]))


_TABLES_ASIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("tiermem_tables_aside", default=False)


@contextlib.contextmanager
def tables_aside() -> Iterator[None]:
    """Within this block, ``state_dict()`` and ``load_state_dict()`` of tiered embedding
    modules leave their tables out: a checkpoint streams them itself
    (:mod:`tiermem.checkpoint`), so a table larger than DRAM is never copied whole."""
    token = _TABLES_ASIDE.set(True)
    try:
        yield
    finally:
        _TABLES_ASIDE.reset(token)


def tiered_tables(module: torch.nn.Module) -> dict[str, EmbeddingTable]:
    """Every tiered table under ``module``, by its ``state_dict`` key prefix."""
    out: dict[str, EmbeddingTable] = {}
    for name, m in module.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(m, TieredEmbeddingBag):
            out[prefix] = m.table
        elif isinstance(m, TieredEmbeddingBagCollection):
            for i, t in enumerate(m.tables):
                out[f"{prefix}tables.{i}."] = t
    return out


def _save_table(t: EmbeddingTable, destination: dict, key: str, keep_vars: bool) -> None:
    if _TABLES_ASIDE.get():
        return
    w = torch.from_numpy(t.to_numpy())
    destination[key + "weight"] = w.to(TORCH_DTYPES[t.dtype])
    st = t.optimizer_state()
    if st is not None:
        kind, values, steps = st
        destination[key + "optimizer_state"] = torch.from_numpy(values)
        destination[key + "optimizer_meta"] = {"kind": kind, "steps": steps}


def _load_table(t: EmbeddingTable, state_dict: dict, key: str, strict: bool, missing: list, error_msgs: list) -> None:
    if _TABLES_ASIDE.get():
        return
    if key + "weight" not in state_dict:
        missing.append(key + "weight")
        return
    w = state_dict[key + "weight"]
    shape = (t.num_embeddings, t.embedding_dim)
    if tuple(w.shape) != shape:
        error_msgs.append(f"size mismatch for {key}weight: checkpoint {tuple(w.shape)}, table {shape}")
        return
    t.load(w.detach().to(torch.float32).cpu().numpy())
    if key + "optimizer_state" in state_dict:
        meta = state_dict.get(key + "optimizer_meta", {})
        t.set_optimizer_state(meta.get("kind", "adagrad"), state_dict[key + "optimizer_state"].numpy(), int(meta.get("steps", 0)))


class TieredEmbeddingBag(_FusedOptimizer, torch.nn.Module):
    """``torch.nn.EmbeddingBag`` over a tiered table, with the optimizer fused into backward.

    Takes ``torch.nn.EmbeddingBag``'s arguments (``scale_grad_by_freq`` is refused with a
    clear error; ``sparse`` is accepted and ignored: gradients never materialise), plus:
    ``mode="max"`` pools the gathered rows with torch's own max (the gradient reaches each
    column's arg-max row); ``max_norm`` rescales the rows a batch reads in the table before
    the lookup, as torch's does in the weight.

    Args:
        manager, placement: where the rows live: a
            :class:`~tiermem.embedding.config.Placement` (home, cache, policy, admission),
            as :class:`tiermem.embedding.EmbeddingTable` takes it.
        where, cache, cacheslack, policy, admission: the placement's settings as keywords
            instead (``where`` is its ``device``; ``"table:PATH"`` keeps the rows in a table
            file on the disk, ``"file:PATH"`` in a plain file).
        optimizer: the name of one of :data:`~tiermem.embedding.OPTIMIZERS` (``"sgd"``,
            ``"adagrad"``, ``"rowwise_adagrad"``, ``"adam"``, ``"lamb"``, ...), applied in
            backward, or an :class:`~tiermem.embedding.OptimizerConfig` for any setting
            (betas, weight decay and its mode, momentum, eta; then leave the settings below
            at their defaults).
        lr, eps, lr_decay, initial_accumulator_value: optimizer settings (as
            ``torch.optim.SGD`` / ``torch.optim.Adagrad`` name them).
        nt_stores: write updated rows with non-temporal stores.
        seed: seed of the ``N(0, 1)`` initialisation (``torch.nn.EmbeddingBag``'s).
        init: ``"auto"`` (default): rows of a new table are initialised, an existing table
            file (``where="block:PATH"``) is re-attached as it is, rows and optimizer state,
            so rebuilding a model resumes it; ``"overwrite"``: initialise the rows (from
            ``_weight`` or the seed) and forget the optimizer state even of an existing file.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
        *,
        manager: Manager | None = None,
        placement: Placement | None = None,
        where: str | int | None = None,
        cache: float | None = None,
        cacheslack: float | None = None,
        policy: str | None = None,
        optimizer: str | OptimizerConfig = "sgd",
        lr: float = 0.01,
        eps: float | None = None,
        lr_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        nt_stores: bool = False,
        seed: int | None = None,
        admission: str | None = None,
        init: str = "auto",
    ) -> None:
        torch.nn.Module.__init__(self)
        _check_init(init)
        if scale_grad_by_freq:
            raise InvalidArgumentError("scale_grad_by_freq is not supported by TieredEmbeddingBag")
        if max_norm is not None and not (float(max_norm) > 0 and float(norm_type) > 0):
            raise InvalidArgumentError(f"max_norm ({max_norm}) and norm_type ({norm_type}) must be positive")
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgumentError(f"mode {mode!r}: TieredEmbeddingBag supports 'sum', 'mean' and 'max'")
        if device is not None and torch.device(device).type != "cpu":
            raise InvalidArgumentError(f"device {device!r}: tiered tables run on the CPU")
        place = _placement(placement, dtype, where, cache, cacheslack, policy, admission)
        if padding_idx is not None and not -int(num_embeddings) <= padding_idx < int(num_embeddings):
            raise _torch_like(
                InvalidArgumentError(f"padding_idx {padding_idx} must be within num_embeddings ({num_embeddings})"),
                AssertionError,
            )
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.mode, self.include_last_offset, self.sparse = mode, bool(include_last_offset), bool(sparse)
        self.max_norm, self.norm_type = None if max_norm is None else float(max_norm), float(norm_type)
        self.table = EmbeddingTable(num_embeddings, embedding_dim, placement=place, manager=manager, padding_idx=padding_idx)
        self.padding_idx = self.table.padding_idx
        self._collection = EmbeddingCollection([self.table])
        self._init_optimizer(optimizer, **_settings(lr, eps, lr_decay, initial_accumulator_value, nt_stores))
        if _weight is not None and tuple(_weight.shape) != (num_embeddings, embedding_dim):
            raise InvalidArgumentError(f"_weight must have shape {(num_embeddings, embedding_dim)}, got {tuple(_weight.shape)}")
        if not _rows_to_initialise(self.table, self.optim, init, given=_weight is not None):
            return
        if _weight is not None:
            self.table.load(_weight.detach().to(torch.float32).numpy())
        else:
            self.reset_parameters(seed)

    def reset_parameters(self, seed: int | None = None) -> None:
        """Rows from ``N(0, 1)`` and a zero padding row, as ``torch.nn.EmbeddingBag``
        initialises them (written in chunks, so the table need not fit in memory twice)."""
        _randn_rows(self.table, seed)

    @property
    def weight(self) -> torch.Tensor:
        """A float32 copy of the rows (writes to it do not reach the table; use
        :meth:`load_state_dict` or ``self.table.load``)."""
        return torch.from_numpy(self.table.to_numpy())

    def prefetch(self, input: torch.Tensor) -> int:
        """Read the rows a coming batch's ``input`` (indices, any shape) will look up into
        the cache now (a block table's, or a ``dynamic`` cache's), so its lookup only hits;
        call it on another thread while the current step computes. No-op for rows held
        directly and for caches that do not cache on lookup. Returns the rows that were
        missing."""
        return self.table.prefetch(input.detach().cpu().numpy())

    def forward(
        self, input: torch.Tensor, offsets: torch.Tensor | None = None, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        _check_psw_mode(per_sample_weights, self.mode)
        _check_psw(per_sample_weights, input, self._out_dtype, TORCH_DTYPES[self.table.dtype])
        try:
            bags = [_bags(input, offsets, self.include_last_offset)]
            w = None if per_sample_weights is None else [_psw(per_sample_weights)]
            if self.max_norm is not None:
                _renorm(self.table, bags[0][0], self.max_norm, self.norm_type)
            return self._output(bags, w)
        except TiermemError as e:
            raise _torch_like(e, RuntimeError) from None

    @classmethod
    def from_pretrained(
        cls,
        embeddings: torch.Tensor,
        freeze: bool = True,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        mode: str = "mean",
        sparse: bool = False,
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        **tiered: Any,
    ) -> TieredEmbeddingBag:
        """A module whose rows are ``embeddings`` (2-D), as
        ``torch.nn.EmbeddingBag.from_pretrained``; ``freeze`` (default) keeps them fixed.
        Keyword arguments of :class:`TieredEmbeddingBag` (``manager``, ``cache``, ...) pass on."""
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2:
            raise _torch_like(InvalidArgumentError("Embeddings parameter is expected to be 2-dimensional"), AssertionError)
        rows, dim = embeddings.shape
        m = cls(
            rows,
            dim,
            max_norm=max_norm,
            norm_type=norm_type,
            scale_grad_by_freq=scale_grad_by_freq,
            mode=mode,
            sparse=sparse,
            _weight=embeddings,
            include_last_offset=include_last_offset,
            padding_idx=padding_idx,
            **tiered,
        )
        m.requires_grad_(not freeze)
        return m

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        _save_table(self.table, destination, prefix, keep_vars)

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        _load_table(self.table, state_dict, prefix, strict, missing_keys, error_msgs)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}, "
            f"placement={self.table.placement!r}, policy={self.table.policy!r}, optimizer={self.optimizer!r}"
        )


class TieredEmbeddingBagCollection(_FusedOptimizer, torch.nn.Module):
    """Many tiered tables in one kernel call (FBGEMM's table-batched layout).

    Args:
        tables: ``(num_embeddings, embedding_dim)`` per table, or ready
            :class:`~tiermem.embedding.EmbeddingTable` objects.
        mode: ``"sum"`` or ``"mean"``.
        Other arguments as :class:`TieredEmbeddingBag` (applied to every table made here).

    ``forward(indices, offsets, per_sample_weights=None)``: ``offsets`` has ``T * B + 1``
    entries over the concatenated indices of all tables (table-major, as FBGEMM takes
    them). Returns ``(B, sum of widths)``. ``forward(kjt)`` takes a ``KeyedJaggedTensor``
    with one feature per table (its weights, if any, as per-sample weights); another number
    of features is refused (:mod:`tiermem.torchrec` maps features to tables by name).
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int] | EmbeddingTable],
        mode: str = "sum",
        *,
        dtype: torch.dtype | None = None,
        manager: Manager | None = None,
        placement: Placement | None = None,
        where: str | int | None = None,
        cache: float | None = None,
        cacheslack: float | None = None,
        policy: str | None = None,
        optimizer: str | OptimizerConfig = "sgd",
        lr: float = 0.01,
        eps: float | None = None,
        lr_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        nt_stores: bool = False,
        seed: int | None = None,
        admission: str | None = None,
        init: str = "auto",
    ) -> None:
        torch.nn.Module.__init__(self)
        _check_init(init)
        if mode not in ("sum", "mean"):
            raise InvalidArgumentError(f"mode {mode!r}: supported are 'sum' and 'mean'")
        if not tables:
            raise InvalidArgumentError("a collection needs at least one table")
        place = _placement(placement, dtype, where, cache, cacheslack, policy, admission)
        self.mode = mode
        made: list[EmbeddingTable] = []
        fresh: list[bool] = []
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        self._init_optimizer(optimizer, **_settings(lr, eps, lr_decay, initial_accumulator_value, nt_stores))
        for k, spec in enumerate(tables):
            if isinstance(spec, EmbeddingTable):
                made.append(spec)
                fresh.append(False)
                continue
            rows, dim = spec
            own = dataclasses.replace(place, device=_table_where(place.device, k, len(tables)))
            t = EmbeddingTable(rows, dim, placement=own, manager=manager)
            made.append(t)
            fresh.append(_rows_to_initialise(t, self.optim, init, given=False))
        for t, f in zip(made, fresh):
            if f:
                _randn_rows(t, None, g)
        self.tables = made
        self._collection = EmbeddingCollection(made)

    def prefetch(self, indices: Any, offsets: Any) -> int:
        """Read the rows of a coming batch (FBGEMM layout, as :meth:`forward` takes it) into
        the tables' caches now (block tables', and ``dynamic`` caches), so its lookup only
        hits; call it on another thread while the current step computes (the GIL is
        released while it reads). No-op for tables held directly and for caches that do not
        cache on lookup. Returns the rows that were missing."""
        return sum(t.prefetch(v) for t, (v, _) in zip(self.tables, self.split(indices, offsets)))

    def split(self, indices: Any, offsets: Any) -> list[tuple[np.ndarray, np.ndarray]]:
        """Split FBGEMM-layout ``indices``/``offsets`` into per-table ``(values, offsets)``."""
        v = _np_i64(indices, "indices")
        o = _np_i64(offsets, "offsets")
        n = len(self.tables)
        if o.ndim != 1 or (len(o) - 1) % n != 0 or len(o) < 1:
            raise InvalidArgumentError(f"offsets must have T * B + 1 entries for T = {n} tables, got {len(o)}")
        b = (len(o) - 1) // n
        if o[-1] != len(v):
            raise InvalidArgumentError(f"the last offset is {o[-1]} but there are {len(v)} indices")
        out = []
        for t in range(n):
            lo, hi = int(o[t * b]), int(o[(t + 1) * b])
            if not 0 <= lo <= hi <= len(v):
                raise InvalidArgumentError(f"offsets of table {t} run from {lo} to {hi}, outside 0..{len(v)}")
            out.append((v[lo:hi], o[t * b : (t + 1) * b + 1] - lo))
        return out

    def forward(
        self, indices: Any, offsets: torch.Tensor | None = None, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        if offsets is None and callable(getattr(indices, "keys", None)) and callable(getattr(indices, "offsets", None)):
            # A KeyedJaggedTensor: one key per table, or the batch would come out wrong.
            keys = list(indices.keys())
            if len(keys) != len(self.tables):
                raise InvalidArgumentError(
                    f"the KeyedJaggedTensor has {len(keys)} features {keys} but this collection has {len(self.tables)} "
                    "tables, one feature each; for several features per table use tiermem.torchrec.EmbeddingBagCollection"
                )
            indices, offsets, per_sample_weights = indices.values(), indices.offsets(), indices.weights_or_none()
        if offsets is None:
            raise InvalidArgumentError("offsets are required (T * B + 1 of them), or pass a KeyedJaggedTensor")
        bags = self.split(indices, offsets)
        w = None
        _check_psw_mode(per_sample_weights, self.mode)
        if per_sample_weights is not None:
            flat = _psw(per_sample_weights)
            assert flat is not None
            o = _np_i64(offsets, "offsets")
            b = (len(o) - 1) // len(self.tables)
            w = [flat[int(o[t * b]) : int(o[(t + 1) * b])] for t in range(len(self.tables))]
        return self._output(bags, w)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for i, t in enumerate(self.tables):
            _save_table(t, destination, f"{prefix}tables.{i}.", keep_vars)

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        for i, t in enumerate(self.tables):
            _load_table(t, state_dict, f"{prefix}tables.{i}.", strict, missing_keys, error_msgs)
