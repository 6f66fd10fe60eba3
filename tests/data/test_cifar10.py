import hashlib
import io
import os
import pickle
import tarfile
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from dpdl.data import cifar10 as cifar_module
from dpdl.data import download_cifar10, load_dataset, read_batch
from dpdl.errors import DatasetNotFound, DPDLError

BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _write_batches(
    folder: Path, per_batch: int = 4, seed: int = 0, protocol: int = 2
) -> dict[str, dict]:
    """Tiny batches in the official format: dict with b'data' uint8 (N, 3072), b'labels'."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in BATCHES:
        batch = {b"batch_label": name.encode(),
                 b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]}
        with open(folder / name, "wb") as handle:
            pickle.dump(batch, handle, protocol=protocol)
        written[name] = batch
    return written


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_loader_shapes_layout_and_per_channel_standardisation(tmp_path, protocol):
    written = _write_batches(tmp_path / "cifar-10-batches-py", protocol=protocol)
    data = load_dataset("cifar10", data_dir=tmp_path)
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    assert data.x_train.dtype == np.float32 and data.num_classes == 10
    raw_train = np.concatenate([written[n][b"data"] for n in BATCHES[:5]]).astype(np.float64)
    raw_test = written["test_batch"][b"data"].astype(np.float64)
    # Each row is 1024 red values, then 1024 green, then 1024 blue.
    planes_train = raw_train.reshape(20, 3, 1024) / 255.0
    planes_test = raw_test.reshape(4, 3, 1024) / 255.0
    # The statistics are those of the public test batch, never of the (private) train batches.
    mean, std = planes_test.mean(axis=(0, 2)), planes_test.std(axis=(0, 2))
    assert not np.allclose(mean, planes_train.mean(axis=(0, 2)), rtol=1e-6, atol=0)
    np.testing.assert_allclose(data.info["mean"], mean, rtol=1e-12)
    np.testing.assert_allclose(data.info["std"], std, rtol=1e-12)
    assert "public test split" in data.info["preprocessing"]
    expected_test = (planes_test - mean[None, :, None]) / std[None, :, None]
    np.testing.assert_allclose(data.x_test.reshape(4, 3, 1024), expected_test, atol=1e-5)
    # The test split is centred with unit std per channel ...
    np.testing.assert_allclose(data.x_test.mean(axis=(0, 2, 3)), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_test.std(axis=(0, 2, 3)), 1.0, atol=1e-5)
    # ... and the train split went through the same per-channel affine map.
    expected_train = (planes_train - mean[None, :, None]) / std[None, :, None]
    np.testing.assert_allclose(data.x_train.reshape(20, 3, 1024), expected_train, atol=1e-5)
    np.testing.assert_array_equal(data.y_test, written["test_batch"][b"labels"])
    np.testing.assert_array_equal(
        data.y_train, np.concatenate([written[n][b"labels"] for n in BATCHES[:5]]))

def test_read_batch_validates(tmp_path):
    bad_shape = {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}
    (tmp_path / "a").write_bytes(pickle.dumps(bad_shape))
    with pytest.raises(DPDLError, match=r"\(N, 3072\)"):
        read_batch(tmp_path / "a")
    bad_labels = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}
    (tmp_path / "b").write_bytes(pickle.dumps(bad_labels))
    with pytest.raises(DPDLError, match="labels outside"):
        read_batch(tmp_path / "b")
    (tmp_path / "c").write_bytes(pickle.dumps({b"labels": [1]}))
    with pytest.raises(DPDLError, match="lacks"):
        read_batch(tmp_path / "c")


class _RunsCode:
    def __reduce__(self):
        return (os.getcwd, ())


def test_read_batch_refuses_code_in_pickle(tmp_path):
    (tmp_path / "evil").write_bytes(pickle.dumps({b"data": _RunsCode(), b"labels": []}))
    with pytest.raises(DPDLError, match="not allowed"):
        read_batch(tmp_path / "evil")


def test_missing_message_says_how_to_get(tmp_path, monkeypatch):
    monkeypatch.delenv("DPDL_DATA", raising=False)
    with pytest.raises(DatasetNotFound) as info:
        load_dataset("cifar10", data_dir=tmp_path)
    message = str(info.value)
    assert "download = true" in message and "data_dir = " in message
    assert "--data-dir" not in message and "--download" not in message  # no such flags
    assert cifar_module.MD5 in message and str(tmp_path) in message


def _tarball(tmp_path: Path, extra_member: str | None = None) -> bytes:
    source = tmp_path / "src"
    _write_batches(source / "cifar-10-batches-py", per_batch=2, seed=1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(source / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        if extra_member:
            info = tarfile.TarInfo(extra_member)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    return buffer.getvalue()


def _serve(monkeypatch, payload: bytes) -> list[str]:
    requested = []

    def fake_urlopen(url, timeout=None):
        requested.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    return requested


def test_download_verifies_md5_and_extracts(tmp_path, monkeypatch):
    payload = _tarball(tmp_path)
    requested = _serve(monkeypatch, payload)
    monkeypatch.setattr(cifar_module, "MD5", hashlib.md5(payload).hexdigest())
    monkeypatch.delenv("DPDL_DATA", raising=False)
    root = tmp_path / "root"
    data = load_dataset("cifar10", data_dir=root, download=True)
    assert requested == [cifar_module.URL]
    assert data.num_train == 10 and data.num_test == 2
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()
    # A second load finds the extracted files and does not download again.
    load_dataset("cifar10", data_dir=root, download=True)
    assert len(requested) == 1


def test_download_with_wrong_md5_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    _serve(monkeypatch, _tarball(tmp_path))
    root = tmp_path / "root"
    # The real MD5 of the official tarball cannot match this fake archive.
    with pytest.raises(DPDLError, match="c58f30108f718f92721af3b95e74349a"):
        download_cifar10(root)
    assert not any(root.iterdir())


def test_unsafe_tar_member_is_refused(tmp_path, monkeypatch):
    payload = _tarball(tmp_path, extra_member="../escape.txt")
    _serve(monkeypatch, payload)
    root = tmp_path / "root"
    with pytest.raises(DPDLError, match="escape.txt"):
        download_cifar10(root, md5=hashlib.md5(payload).hexdigest())
    assert not (tmp_path / "escape.txt").exists()
    assert not (root / "cifar-10-batches-py").exists()


def test_offline_download_is_a_clear_error(tmp_path, monkeypatch):
    def offline(url, timeout=None):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(DatasetNotFound, match="could not download"):
        download_cifar10(tmp_path / "root")
