"""tiermem.torchrec's collections against TorchRec's own (torchrec, BSD-3; only the module
under test is swapped): the same configs, KeyedJaggedTensor in and KeyedTensor (or
JaggedTensors) out, state_dict keys that load strictly either way, equal outputs (sum and
mean, mixed widths, two features sharing a table, a feature read by two tables, weighted
features, unpooled sequences), equal rows after SGD steps, TorchRec's initialisation, and
each mismatched input refused by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchRecEBC  # noqa: E402
from torchrec.modules.embedding_modules import EmbeddingCollection as TorchRecEC  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor  # noqa: E402

from tiermem import InvalidArgumentError  # noqa: E402
from tiermem.embedding import Placement  # noqa: E402
from tiermem.torchrec import EmbeddingBagCollection, EmbeddingCollection  # noqa: E402

CONFIGS = [
    EmbeddingBagConfig(name="t_user", num_embeddings=50, embedding_dim=8, feature_names=["user", "friend"]),
    EmbeddingBagConfig(name="t_item", num_embeddings=30, embedding_dim=4, feature_names=["item"], pooling=PoolingType.MEAN),
]
FEATURES = ["user", "friend", "item"]
ROWS = {"user": 50, "friend": 50, "item": 30}


def kjt(batch: int, seed: int, weighted: bool = False) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURES) * batch,), generator=g)
    values = torch.cat(
        [
            torch.randint(0, ROWS[f], (int(lengths[i * batch : (i + 1) * batch].sum()),), generator=g)
            for i, f in enumerate(FEATURES)
        ]
    )
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths, weights=weights)


def twins(weighted: bool = False, configs: list[EmbeddingBagConfig] = CONFIGS) -> tuple[TorchRecEBC, EmbeddingBagCollection]:
    torch.manual_seed(0)
    theirs = TorchRecEBC(tables=configs, is_weighted=weighted, device=torch.device("cpu"))
    ours = EmbeddingBagCollection(configs, is_weighted=weighted, lr=0.1)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_outputs_equal_torchrecs(weighted: bool) -> None:
    configs = CONFIGS if not weighted else [EmbeddingBagConfig(**{**c.__dict__, "pooling": PoolingType.SUM}) for c in CONFIGS]
    theirs, ours = twins(weighted, configs)
    for seed in range(3):
        x = kjt(5, seed, weighted)
        want, got = theirs(x), ours(x)
        assert isinstance(got, KeyedTensor)
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-6, atol=1e-6)
        for f in FEATURES:
            torch.testing.assert_close(got[f], want[f], rtol=1e-6, atol=1e-6)


def test_state_dicts_load_strictly_either_way() -> None:
    theirs, ours = twins()
    assert (
        list(ours.state_dict()) == list(theirs.state_dict()) == ["embedding_bags.t_user.weight", "embedding_bags.t_item.weight"]
    )
    again = TorchRecEBC(tables=CONFIGS, device=torch.device("cpu"))
    again.load_state_dict(ours.state_dict(), strict=True)
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v)
    assert ours.embedding_bag_configs() == CONFIGS and not ours.is_weighted()


def test_sgd_steps_give_torchrecs_rows() -> None:
    """The fused SGD in backward against TorchRec's module with torch.optim.SGD (two
    features sharing a table: their gradients add, as dense SGD's do)."""
    theirs, ours = twins()
    before = {k: v.clone() for k, v in theirs.state_dict().items()}
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(9)
    scale = torch.randn(5, 20, generator=g)
    for step in range(5):
        x = kjt(5, 100 + step)
        for m in (theirs, ours):
            loss = (m(x).values() * scale).sum()
            loss.backward()
        opt.step()
        opt.zero_grad()
    for k, v in theirs.state_dict().items():
        assert not torch.equal(v, before[k])  # both trained
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-6, atol=1e-6)


def test_a_shared_table_takes_one_adagrad_step_of_its_features_summed_gradient() -> None:
    """Two features read ``t_user``: as FBGEMM's table-batched kernels do, each batch is one
    optimizer step on the rows' summed gradient (two steps, one per feature, would give
    other rows under Adagrad), checked against TorchRec's module with torch.optim.Adagrad
    (which, over a dense gradient, leaves rows without one unchanged)."""
    torch.manual_seed(0)
    theirs = TorchRecEBC(tables=CONFIGS, device=torch.device("cpu"))
    ours = EmbeddingBagCollection(CONFIGS, optimizer="adagrad", lr=0.1, eps=1e-8)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    opt = torch.optim.Adagrad(theirs.parameters(), lr=0.1, eps=1e-8)
    scale = torch.randn(5, 20, generator=torch.Generator().manual_seed(9))
    x = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES,
        values=torch.tensor([3, 3, 7, 3, 1, 2]),
        lengths=torch.tensor([2, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0]),
    )
    for step in range(4):
        for m in (theirs, ours):
            (m(x if step == 0 else kjt(5, 200 + step)).values() * scale).sum().backward()
        opt.step()
        opt.zero_grad()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-6, atol=1e-6)
    assert ours.fused_optimizer.state_dict()["state"]["embedding_bags.t_user.weight"]["steps"] == 4


def test_mismatched_inputs_are_refused_by_name() -> None:
    _, ours = twins()
    x = kjt(3, 0)
    with pytest.raises(InvalidArgumentError, match=r"not configured: \['page'\]"):
        ours(
            KeyedJaggedTensor.from_lengths_sync(
                keys=[*FEATURES, "page"], values=x.values(), lengths=torch.cat([x.lengths(), torch.zeros(3, dtype=torch.long)])
            )
        )
    with pytest.raises(InvalidArgumentError, match=r"missing: \['item'\]"):
        d = x.to_dict()
        ours(KeyedJaggedTensor.from_jt_dict({"user": d["user"], "friend": d["friend"]}))
    bad = KeyedJaggedTensor(keys=FEATURES, values=x.values()[:-1], lengths=x.lengths())
    with pytest.raises(InvalidArgumentError, match="lengths add up to"):
        ours(bad)
    with pytest.raises(InvalidArgumentError, match="weighted but the KeyedJaggedTensor has no weights"):
        twins(True, [EmbeddingBagConfig(**{**c.__dict__, "pooling": PoolingType.SUM}) for c in CONFIGS])[1](x)
    with pytest.raises(InvalidArgumentError, match="expected a torchrec KeyedJaggedTensor"):
        ours(x.values())


def test_bad_configs_are_refused_by_name() -> None:
    c = CONFIGS[0]
    with pytest.raises(InvalidArgumentError, match="'t_user' is configured twice"):
        EmbeddingBagCollection([c, c])
    with pytest.raises(InvalidArgumentError, match="'dup' names a feature twice"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="dup", num_embeddings=5, embedding_dim=4, feature_names=["f", "f"])])
    with pytest.raises(InvalidArgumentError, match="pooling"):
        EmbeddingBagCollection(
            [EmbeddingBagConfig(name="n", num_embeddings=5, embedding_dim=4, feature_names=["f"], pooling=PoolingType.NONE)]
        )
    with pytest.raises(InvalidArgumentError, match="expected torchrec EmbeddingBagConfig"):
        EmbeddingBagCollection([(5, 4)])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="not configured: \\['nope'\\]"):
        EmbeddingBagCollection(CONFIGS, placement={"nope": None})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgumentError, match="run on the CPU"):
        EmbeddingBagCollection(CONFIGS, device="cuda")
    with pytest.raises(InvalidArgumentError, match="data_type INT8 is not trainable here"):
        EmbeddingBagCollection(
            [EmbeddingBagConfig(name="q", num_embeddings=5, embedding_dim=4, feature_names=["f"], data_type=DataType.INT8)]
        )
    with pytest.raises(InvalidArgumentError, match="contradicts the placement's bfloat16"):
        EmbeddingBagCollection(
            [EmbeddingBagConfig(name="h", num_embeddings=5, embedding_dim=4, feature_names=["f"], data_type=DataType.FP16)],
            placement=Placement(dtype="bfloat16"),
        )
    with pytest.raises(InvalidArgumentError, match=r"unknown arguments \['learning_rate'\]"):
        EmbeddingBagCollection(CONFIGS, learning_rate=0.1)  # type: ignore[call-arg]


def test_a_feature_read_by_two_tables_is_named_per_table() -> None:
    configs = [
        EmbeddingBagConfig(name="t1", num_embeddings=10, embedding_dim=3, feature_names=["f1"]),
        EmbeddingBagConfig(name="t2", num_embeddings=10, embedding_dim=4, feature_names=["f1"]),
    ]
    torch.manual_seed(0)
    theirs = TorchRecEBC(tables=configs)
    ours = EmbeddingBagCollection(configs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    x = KeyedJaggedTensor.from_offsets_sync(keys=["f1"], values=torch.tensor([0, 1, 2, 3]), offsets=torch.tensor([0, 2, 2, 4]))
    want, got = theirs(x), ours(x)
    assert got.keys() == want.keys() == ["f1@t1", "f1@t2"] and got.offset_per_key() == [0, 3, 7]
    torch.testing.assert_close(got.values(), want.values())


def test_tables_start_as_torchrecs_init_fn_draws_them() -> None:
    """Each table's rows come from its config's init_fn (TorchRec's default: uniform within
    +-sqrt(1/rows)) on the global RNG."""
    big = EmbeddingBagConfig(name="b", num_embeddings=400, embedding_dim=8, feature_names=["f"])
    fixed = EmbeddingBagConfig(
        name="c", num_embeddings=20, embedding_dim=8, feature_names=["g"], init_fn=lambda w: torch.nn.init.constant_(w, 0.25)
    )
    ours = EmbeddingBagCollection([big, fixed])
    w = ours.state_dict()["embedding_bags.b.weight"]
    bound = (1 / 400) ** 0.5
    assert float(w.abs().max()) <= bound and float(w.std()) > bound / 4
    assert torch.equal(ours.state_dict()["embedding_bags.c.weight"], torch.full((20, 8), 0.25))


EC_CONFIGS = [
    EmbeddingConfig(name="t1", num_embeddings=10, embedding_dim=5, feature_names=["f1", "f2"]),
    EmbeddingConfig(name="t2", num_embeddings=10, embedding_dim=5, feature_names=["f2"]),
]


def test_sequence_embeddings_equal_torchrecs_and_train_alike() -> None:
    torch.manual_seed(0)
    theirs = TorchRecEC(tables=EC_CONFIGS, need_indices=True)
    ours = EmbeddingCollection(EC_CONFIGS, need_indices=True, lr=0.1)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == ["embeddings.t1.weight", "embeddings.t2.weight"]
    opt = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        x = KeyedJaggedTensor.from_lengths_sync(
            keys=["f1", "f2"], values=torch.randint(0, 10, (9,), generator=g), lengths=torch.tensor([2, 3, 1, 3])
        )
        want, got = theirs(x), ours(x)
        assert set(got) == set(want) == {"f1", "f2@t1", "f2@t2"}
        for k in want:
            torch.testing.assert_close(got[k].values(), want[k].values(), rtol=1e-6, atol=1e-6)
            assert torch.equal(got[k].lengths(), want[k].lengths()) and torch.equal(got[k].weights(), want[k].weights())
        for m in (theirs, ours):
            sum((v.values() * (i + 1)).sum() for i, v in enumerate(m(x).values())).backward()
        opt.step()
        opt.zero_grad()
    for k, v in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-6, atol=1e-6)


def test_the_plain_collection_takes_a_kjt_with_one_feature_per_table_and_refuses_others() -> None:
    """Three features over two tables once came out as a batch of 3 where 2 was meant."""
    from tiermem.torch import TieredEmbeddingBagCollection

    coll = TieredEmbeddingBagCollection([(50, 8), (30, 4)], mode="sum", seed=0)
    g = torch.Generator().manual_seed(0)
    two = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.randint(0, 30, (6,), generator=g), lengths=torch.tensor([1, 2, 2, 1])
    )
    torch.testing.assert_close(coll(two), coll(two.values(), two.offsets()))
    assert coll(two).shape == (2, 12)
    with pytest.raises(InvalidArgumentError, match=r"has 3 features \['user', 'friend', 'item'\] but this collection has 2"):
        coll(kjt(2, 0))


def test_a_rebuilt_collection_resumes_its_table_files(tmp_path) -> None:
    """A table in a file is re-attached as it is when the model is built again (its trained
    rows are never re-initialised), unless init="overwrite"."""

    place = {"t_user": Placement(device=f"table:{tmp_path / 'user.tbl'}", cache=0.9)}
    first = EmbeddingBagCollection(CONFIGS, placement=place, lr=0.5)
    (first(kjt(4, 1)).values() * 3).sum().backward()
    trained = first.state_dict()["embedding_bags.t_user.weight"].clone()
    del first
    again = EmbeddingBagCollection(CONFIGS, placement=place, lr=0.5)
    assert torch.equal(again.state_dict()["embedding_bags.t_user.weight"], trained)
    del again
    fresh = EmbeddingBagCollection(CONFIGS, placement=place, init="overwrite")
    assert not torch.equal(fresh.state_dict()["embedding_bags.t_user.weight"], trained)


@pytest.mark.parametrize("data_type", [DataType.FP16, DataType.BF16])
def test_half_precision_tables_keep_their_type_and_pool_in_float32(data_type: DataType) -> None:
    """A config's ``data_type`` is the rows' storage type, and pooling accumulates in
    float32. TorchRec's unsharded collection keeps every type but FP32 as float16 (its
    sharded FBGEMM tables keep BF16): a BF16 table loads its float16 rows rounded."""
    configs = [EmbeddingBagConfig(**{**c.__dict__, "data_type": data_type}) for c in CONFIGS]
    theirs, ours = twins(configs=configs)
    own = {DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}[data_type]
    for k, v in theirs.state_dict().items():
        got = ours.state_dict()[k]
        assert (got.dtype, v.dtype) == (own, torch.float16)
        assert torch.equal(got, v.to(own))
    x = kjt(6, 1)
    rows = {t: ours.state_dict()[f"embedding_bags.{t}.weight"].float() for t in ("t_user", "t_item")}
    want = torch.cat(
        [
            torch.nn.functional.embedding_bag(x[f].values(), rows[t], x[f].offsets(), mode=m, include_last_offset=True)
            for f, t, m in [("user", "t_user", "sum"), ("friend", "t_user", "sum"), ("item", "t_item", "mean")]
        ],
        dim=1,
    )
    torch.testing.assert_close(ours(x).values(), want, rtol=1e-6, atol=1e-6)
    tol = 1e-2 if data_type == DataType.BF16 else 2e-3
    torch.testing.assert_close(ours(x).values(), theirs(x).values().float(), rtol=tol, atol=tol)


def test_optimizer_state_travels_through_fused_optimizer_and_resumes_exactly(tmp_path) -> None:
    """The module's state_dict holds TorchRec's keys alone (so it loads strictly into
    TorchRec's collection); the row-wise Adagrad state goes through ``fused_optimizer``.
    Five steps, a torch.save of both, a fresh collection loading both, five more: the rows of
    ten uninterrupted steps."""
    from tiermem.embedding import OptimizerConfig
    from tiermem.torchrec import FusedOptimizer

    opt = OptimizerConfig("rowwise_adagrad", lr=0.2)
    theirs, _ = twins()
    start = theirs.state_dict()

    def fresh(where: str) -> EmbeddingBagCollection:
        c = EmbeddingBagCollection(CONFIGS, optimizer=opt, placement=Placement(device=f"table:{tmp_path / where}", cache=1.0))
        c.load_state_dict(start, strict=True)
        return c

    def train(c: EmbeddingBagCollection, seeds: range) -> None:
        for s in seeds:
            c(kjt(6, s)).values().pow(2).sum().backward()

    for d in ("whole", "first", "second"):
        (tmp_path / d).mkdir()
    whole, first = fresh("whole"), fresh("first")
    train(whole, range(10))
    train(first, range(5))
    assert list(first.state_dict()) == list(start)
    TorchRecEBC(tables=CONFIGS, device=torch.device("cpu")).load_state_dict(first.state_dict(), strict=True)
    fo = first.fused_optimizer
    assert isinstance(fo, FusedOptimizer) and set(fo.state_dict()["state"]) == set(start)
    torch.save({"model": first.state_dict(), "optim": fo.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    second = fresh("second")
    second.load_state_dict(ck["model"], strict=True)
    second.fused_optimizer.load_state_dict(ck["optim"])
    train(second, range(5, 10))
    for k, v in whole.state_dict().items():
        torch.testing.assert_close(second.state_dict()[k], v, rtol=1e-6, atol=1e-6)
    bad = {**ck["optim"], "state": {**ck["optim"]["state"], "embedding_bags.nope.weight": {}}}
    with pytest.raises(InvalidArgumentError, match=r"not here \['embedding_bags.nope.weight'\]"):
        second.fused_optimizer.load_state_dict(bad)
    sgd = EmbeddingBagCollection(CONFIGS)
    with pytest.raises(InvalidArgumentError, match="the saved state is 'rowwise_adagrad'"):
        sgd.fused_optimizer.load_state_dict(ck["optim"])


def test_fused_params_as_torchrecs_sharders_take_them() -> None:
    """TorchRec's fused_params (FBGEMM's EmbOptimType and WeightDecayMode, FBGEMM's key
    names) give the tables' optimizer; other keys and optimizers are refused by name."""
    fb = pytest.importorskip("fbgemm_gpu.split_embedding_configs")
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    ebc = EmbeddingBagCollection(
        CONFIGS,
        fused_params={
            "optimizer": fb.EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": 0.2,
            "eps": 1e-6,
            "weight_decay": 0.01,
            "weight_decay_mode": WeightDecayMode.DECOUPLE,
        },
    )
    o = ebc.embedding_bags["t_user"].optim
    assert (o.name, o.lr, o.eps, o.weight_decay, o.weight_decay_mode) == ("rowwise_adagrad", 0.2, 1e-6, 0.01, "decoupled")
    lamb = EmbeddingBagCollection(CONFIGS, fused_params={"optimizer": "LAMB", "learning_rate": 0.1, "beta1": 0.8})
    assert (lamb.embedding_bags["t_item"].optim.name, lamb.embedding_bags["t_item"].optim.beta1) == ("lamb", 0.8)
    none = EmbeddingBagCollection(CONFIGS, fused_params={"optimizer": "EXACT_ROWWISE_ADAGRAD", "weight_decay": 0.5})
    assert none.embedding_bags["t_user"].optim.weight_decay == 0.0  # FBGEMM's default mode NONE: no decay
    for params, match in [
        ({"optimizer": fb.EmbOptimType.SHAMPOO}, "optimizer SHAMPOO"),
        ({"optimizer": "ADAM", "stochastic_rounding": True}, r"\['stochastic_rounding'\]"),
        ({"optimizer": "EXACT_ROWWISE_ADAGRAD", "weight_decay_mode": WeightDecayMode.COUNTER}, "weight_decay_mode COUNTER"),
        ({"learning_rate": 0.1}, "no 'optimizer'"),
    ]:
        with pytest.raises(InvalidArgumentError, match=match):
            EmbeddingBagCollection(CONFIGS, fused_params=params)
    with pytest.raises(InvalidArgumentError, match="not both"):
        EmbeddingBagCollection(CONFIGS, fused_params={"optimizer": "ADAM"}, lr=0.1)


def test_one_table_file_for_several_tables_is_refused_and_a_folder_splits(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="2 tables cannot share the one table file"):
        EmbeddingBagCollection(CONFIGS, placement=Placement(device=f"table:{tmp_path / 'one.tbl'}", cache=1.0))
    EmbeddingBagCollection(CONFIGS, placement=Placement(device=f"table:{tmp_path}", cache=1.0))
    assert sorted(p.name for p in tmp_path.glob("*.tbl")) == ["t_item.tbl", "t_user.tbl"]
    one = EmbeddingBagCollection(CONFIGS[:1], placement=Placement(device=f"table:{tmp_path / 'one.tbl'}", cache=1.0))
    assert one.embedding_bags["t_user"].table.attached is False and (tmp_path / "one.tbl").exists()
