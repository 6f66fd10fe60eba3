import gzip
from pathlib import Path

import numpy as np
import pytest

from dpdl.data import find_fashion_mnist, load_dataset, parse_idx, read_idx, write_idx
from dpdl.data.fashion_mnist import FILES, SYSTEM_DIR
from dpdl.errors import DatasetNotFound, DPDLError


def _hand_made_idx(array: np.ndarray) -> bytes:
    """IDX bytes built directly from the format description (independent of write_idx)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(s).to_bytes(4, "big") for s in array.shape
    )
    return header + array.astype(np.uint8).tobytes()


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_hand_made_file(tmp_path, compress):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = _hand_made_idx(images)
    path = tmp_path / ("x.idx.gz" if compress else "x.idx")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    decoded = read_idx(path, expected_ndim=3)
    assert decoded.dtype == np.uint8
    np.testing.assert_array_equal(decoded, images)


def test_write_then_read_multibyte_roundtrip(tmp_path):
    values = np.array([[1, -2, 300000], [4, 5, -6]], dtype=np.int32)
    write_idx(tmp_path / "v.gz", values)
    with gzip.open(tmp_path / "v.gz") as handle:
        assert handle.read(4) == bytes([0, 0, 0x0C, 2])
    np.testing.assert_array_equal(read_idx(tmp_path / "v.gz"), values)


def test_parse_idx_rejects_corruption():
    good = _hand_made_idx(np.zeros((3, 2, 2), np.uint8))
    with pytest.raises(DPDLError, match="bad magic number 0x01000803"):
        parse_idx(b"\x01" + good[1:])
    with pytest.raises(DPDLError, match="holds 11 data bytes"):
        parse_idx(good[:-1])
    with pytest.raises(DPDLError, match="expected 1"):
        parse_idx(good, expected_ndim=1)
    with pytest.raises(DPDLError, match="too short"):
        parse_idx(b"\x00\x00")


def test_truncated_gzip_is_a_clear_error(tmp_path):
    blob = gzip.compress(_hand_made_idx(np.zeros((50, 28, 28), np.uint8)))
    (tmp_path / "bad.gz").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(DPDLError, match="bad.gz"):
        read_idx(tmp_path / "bad.gz")


def _write_tiny_fashion(folder: Path, n_train=12, n_test=5, gz=True):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "y_train": rng.integers(0, 10, n_train).astype(np.uint8),
        "x_test": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "y_test": rng.integers(0, 10, n_test).astype(np.uint8),
    }
    for key, stem in FILES.items():
        raw = _hand_made_idx(arrays[key])
        if gz:
            (folder / (stem + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (folder / stem).write_bytes(raw)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_loader_on_tiny_files_standardises_with_test_stats(tmp_path, gz):
    arrays = _write_tiny_fashion(tmp_path / "fm", gz=gz)
    data = load_dataset("fashion-mnist", data_dir=tmp_path / "fm")
    assert data.x_train.shape == (12, 1, 28, 28) and data.x_test.shape == (5, 1, 28, 28)
    assert "public test split" in data.info["preprocessing"]
    # Scalar mean/std of the public test images (the train images are private).
    scaled_test = arrays["x_test"].astype(np.float64) / 255.0
    mean, std = scaled_test.mean(), scaled_test.std()
    assert data.info["mean"] == pytest.approx(mean, rel=1e-12)
    assert data.info["std"] == pytest.approx(std, rel=1e-12)
    np.testing.assert_allclose(data.x_test[:, 0], (scaled_test - mean) / std, rtol=1e-5,
                               atol=1e-6)
    assert float(data.x_test.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(data.x_test.std()) == pytest.approx(1.0, abs=1e-5)
    # The train images went through the same affine map.
    expected_train = (arrays["x_train"] / 255.0 - mean) / std
    np.testing.assert_allclose(data.x_train[:, 0], expected_train, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(data.y_train, arrays["y_train"])
    np.testing.assert_array_equal(data.y_test, arrays["y_test"])


def test_search_order_prefers_data_dir_then_env(tmp_path, monkeypatch):
    _write_tiny_fashion(tmp_path / "env" / "fashion-mnist", n_train=7)
    monkeypatch.setenv("DPDL_DATA", str(tmp_path / "env"))
    assert find_fashion_mnist(None)["x_train"].parent == tmp_path / "env" / "fashion-mnist"
    _write_tiny_fashion(tmp_path / "arg", n_train=9)
    assert load_dataset("fashion-mnist", data_dir=tmp_path / "arg").num_train == 9


def test_an_explicit_data_dir_is_never_replaced_by_another_copy(tmp_path, monkeypatch):
    _write_tiny_fashion(tmp_path / "env", n_train=7)
    monkeypatch.setenv("DPDL_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetNotFound, match="not found"):
        load_dataset("fashion-mnist", data_dir=tmp_path / "typo")


def test_missing_files_message_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DPDL_DATA", str(tmp_path / "nothing"))
    monkeypatch.setattr("dpdl.data.fashion_mnist.SYSTEM_DIR", tmp_path / "no-system")
    with pytest.raises(DatasetNotFound) as info:
        load_dataset("fashion-mnist", data_dir=tmp_path / "empty")
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert "zalandoresearch/fashion-mnist" in message and "data_dir = " in message
    assert "--data-dir" not in message  # dpdl run has no such flag
    assert str(tmp_path / "empty") in message


def test_image_label_count_mismatch_is_refused(tmp_path):
    _write_tiny_fashion(tmp_path, n_train=6)
    labels = np.zeros(5, np.uint8)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_hand_made_idx(labels)))
    with pytest.raises(DPDLError, match="6 images but 5 labels"):
        load_dataset("fashion-mnist", data_dir=tmp_path)


def test_wrong_image_size_is_refused(tmp_path):
    _write_tiny_fashion(tmp_path)
    small = np.zeros((12, 8, 8), np.uint8)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(_hand_made_idx(small)))
    with pytest.raises(DPDLError, match=r"\(12, 8, 8\)"):
        load_dataset("fmnist", data_dir=tmp_path)


@pytest.mark.skipif(
    not (SYSTEM_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason=f"Fashion-MNIST not installed in {SYSTEM_DIR} (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.delenv("DPDL_DATA", raising=False)
    data = load_dataset("fashion-mnist", data_dir=SYSTEM_DIR)
    assert (data.num_train, data.num_test) == (60_000, 10_000)
    assert data.x_train.shape == (60_000, 1, 28, 28) and data.x_train.dtype == np.float32
    # Published facts: balanced classes (6000 / 1000 per class).
    np.testing.assert_array_equal(np.bincount(data.y_train), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(data.y_test), np.full(10, 1000))
    # The official content (pinned digest): a public benchmark, so its splits' label
    # histograms may be released (dpdl.data.is_public_benchmark)
    from dpdl.data import is_public_benchmark

    assert is_public_benchmark("fashion-mnist", data) == "fashion-mnist"
    # Standardised with the public test images' pixel mean/std, computed here straight from the
    # raw test IDX file (16-byte header, then uint8 pixels); published: about 0.2868 / 0.3524
    # (the train images' 0.2860 / 0.3530 must not be used).
    raw = gzip.decompress((SYSTEM_DIR / "t10k-images-idx3-ubyte.gz").read_bytes())
    assert raw[:4] == bytes([0, 0, 0x08, 3])
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16).astype(np.float64) / 255.0
    assert pixels.size == 10_000 * 28 * 28
    assert data.info["mean"] == pytest.approx(pixels.mean(), rel=1e-9)
    assert data.info["std"] == pytest.approx(pixels.std(), rel=1e-9)
    assert data.info["mean"] == pytest.approx(0.2868, abs=5e-4)
    assert data.info["std"] == pytest.approx(0.3524, abs=5e-4)
    assert float(data.x_test.mean(dtype=np.float64)) == pytest.approx(0.0, abs=1e-5)
    assert float(data.x_test.std(dtype=np.float64)) == pytest.approx(1.0, abs=1e-5)
    # Train pixels went through the same map: their mean is about (0.2860 - 0.2868) / 0.3524,
    # close to but not 0.
    raw_train = gzip.decompress((SYSTEM_DIR / "train-images-idx3-ubyte.gz").read_bytes())
    train_pixel_mean = np.frombuffer(raw_train, np.uint8, offset=16).mean(dtype=np.float64) / 255
    expected_train_mean = (train_pixel_mean - pixels.mean()) / pixels.std()
    assert expected_train_mean < -1e-3
    train_mean = float(data.x_train.mean(dtype=np.float64))
    assert train_mean == pytest.approx(expected_train_mean, rel=1e-4)
