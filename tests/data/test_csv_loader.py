import numpy as np
import pytest
from sklearn.model_selection import train_test_split

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


def test_regression_csv_with_header(tmp_path):
    path, features, price = _housing_like(tmp_path)
    data = load_csv(path, seed=4)
    assert data.task == "regression" and data.input_shape == (3,)
    assert data.info["features"] == ["rooms", "age", "income"]
    idx_train, _ = train_test_split(np.arange(60), test_size=0.2, random_state=4)
    np.testing.assert_allclose(np.sort(data.y_train), np.sort(price[idx_train]), rtol=1e-5)
    np.testing.assert_allclose(data.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_train.std(axis=0), 1.0, atol=1e-5)


def test_binarize_median_and_row_normalisation(tmp_path):
    path, _, price = _housing_like(tmp_path, header=False, sep=";")
    data = load_csv(path, binarize="median", normalize_rows=True, seed=1)
    assert data.task == "classification" and data.num_classes == 2
    idx_train, _ = train_test_split(np.arange(60), test_size=0.2, random_state=1)
    expected_threshold = np.median(np.round(price, 6)[idx_train])
    assert data.info["binarize_threshold"] == pytest.approx(expected_threshold, abs=1e-9)
    train_share = data.y_train.mean()
    assert 0.4 <= train_share <= 0.6  # the train median splits the train labels in half
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
