import numpy as np
import pytest
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import Normalizer, StandardScaler

from dpdl.data import load_csv, load_dataset
from dpdl.errors import DatasetNotFound, DPDLError


def _housing_like(tmp_path, n=60, header=True, sep=","):
    rng = np.random.default_rng(0)
    features = rng.normal(size=(n, 3)) * [1.0, 10.0, 100.0] + [0.0, 5.0, -50.0]
    price = features @ [1.0, 0.1, 0.01] + rng.normal(size=n)
    lines = [sep.join(["rooms", "age", "income", "price"])] if header else []
    lines += [sep.join(f"{v:.6f}" for v in (*row, y)) for row, y in zip(features, price,
                                                                      strict=True)]
    path = tmp_path / "housing.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, features, price


def _sorted_split(n, test_size, seed, stratify=None):
    idx_train, idx_test = train_test_split(
        np.arange(n), test_size=test_size, random_state=seed, stratify=stratify
    )
    return np.sort(idx_train), np.sort(idx_test)


def test_regression_csv_with_header(tmp_path):
    path, features, price = _housing_like(tmp_path)
    data = load_csv(path, seed=4)
    assert data.task == "regression" and data.input_shape == (3,)
    assert data.info["features"] == ["rooms", "age", "income"]
    assert "public test split" in data.info["preprocessing"]
    idx_train, idx_test = _sorted_split(60, 0.2, 4)
    written = np.round(features, 6)  # what the CSV holds (6 decimals)
    np.testing.assert_allclose(data.y_train, price[idx_train], rtol=1e-5)
    np.testing.assert_allclose(data.y_test, price[idx_test], rtol=1e-5)
    # Standardised with the statistics of the public test split: test is centred with unit
    # std, and train went through the same affine map.
    scaler = StandardScaler().fit(written[idx_test])
    np.testing.assert_allclose(data.x_test, scaler.transform(written[idx_test]), atol=1e-5)
    np.testing.assert_allclose(data.x_train, scaler.transform(written[idx_train]), atol=1e-5)
    np.testing.assert_allclose(data.x_test.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_test.std(axis=0), 1.0, atol=1e-5)


def test_binarize_median_and_row_normalisation(tmp_path):
    path, features, price = _housing_like(tmp_path, header=False, sep=";")
    data = load_csv(path, binarize="median", normalize_rows=True, seed=1)
    assert data.task == "classification" and data.num_classes == 2
    idx_train, idx_test = _sorted_split(60, 0.2, 1)
    written_price = np.round(price, 6)
    # The threshold is the median of the public test split's labels, not of the train labels.
    expected_threshold = np.median(written_price[idx_test])
    assert expected_threshold != pytest.approx(np.median(written_price[idx_train]), abs=1e-6)
    assert data.info["binarize_threshold"] == pytest.approx(expected_threshold, abs=1e-9)
    # 12 distinct test labels: the test median puts exactly half of them above it.
    assert data.y_test.mean() == 0.5
    np.testing.assert_array_equal(data.y_test, written_price[idx_test] > expected_threshold)
    np.testing.assert_array_equal(data.y_train, written_price[idx_train] > expected_threshold)
    # Standardised with the test split's statistics, then each row scaled to unit norm.
    written = np.round(features, 6)
    scaler = StandardScaler().fit(written[idx_test])
    np.testing.assert_allclose(
        data.x_train, Normalizer().transform(scaler.transform(written[idx_train])), atol=1e-5)
    np.testing.assert_allclose(
        data.x_test, Normalizer().transform(scaler.transform(written[idx_test])), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(data.x_train, axis=1), 1.0, atol=1e-5)
    via_registry = load_dataset(f"csv:{path}", seed=1)
    assert via_registry.task == "regression" and via_registry.num_train == data.num_train


def test_options_in_dataset_name(tmp_path):
    path, _, _ = _housing_like(tmp_path)
    data = load_dataset(f"csv:{path}?binarize=0.5&normalize_rows=true&test_fraction=0.25")
    assert data.num_test == 15 and data.info["binarize_threshold"] == 0.5
    np.testing.assert_allclose(np.linalg.norm(data.x_test, axis=1), 1.0, atol=1e-5)
    with pytest.raises(DPDLError, match="'colour'"):
        load_dataset(f"csv:{path}?colour=red")
    with pytest.raises(DPDLError, match="'abc'"):
        load_dataset(f"csv:{path}?test_fraction=abc")


def test_string_labels_become_classes(tmp_path):
    rows = ["a,b,label"] + [f"{i},{i % 3},{'yes' if i % 2 else 'no'}" for i in range(20)]
    (tmp_path / "t.csv").write_text("\n".join(rows))
    data = load_csv(tmp_path / "t.csv")
    assert data.task == "classification" and data.info["classes"] == ["no", "yes"]
    assert set(np.unique(data.y_train)) == {0, 1}


def test_csv_errors(tmp_path):
    with pytest.raises(DatasetNotFound, match="nope.csv"):
        load_csv(tmp_path / "nope.csv")
    (tmp_path / "bad.csv").write_text("x,y\n1,2\nfoo,3\n4,5\n")
    with pytest.raises(DPDLError, match="'foo'"):
        load_csv(tmp_path / "bad.csv")
    (tmp_path / "ragged.csv").write_text("1,2,3\n4,5\n6,7,8\n")
    with pytest.raises(DPDLError, match="line 2"):
        load_csv(tmp_path / "ragged.csv")
    (tmp_path / "s.csv").write_text("1,a\n2,b\n3,a\n4,b\n")
    with pytest.raises(DPDLError, match="numeric label"):
        load_csv(tmp_path / "s.csv", binarize="median")
