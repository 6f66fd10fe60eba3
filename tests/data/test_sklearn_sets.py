import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import Normalizer, StandardScaler
from sklearn.utils import Bunch

from dpdl.data import Dataset, load_dataset
from dpdl.data.preprocessing import standardize
from dpdl.errors import DPDLError


def _sorted_split(n, seed, stratify=None):
    """The loaders' seeded 80/20 split, recomputed with scikit-learn (indices sorted)."""
    idx_train, idx_test = train_test_split(
        np.arange(n), test_size=0.2, random_state=seed, stratify=stratify
    )
    return np.sort(idx_train), np.sort(idx_test)


def test_digits_shapes_counts_and_split():
    digits = load_dataset("digits", seed=3)
    # scikit-learn documents 1797 8x8 images of 10 classes; 20 % held out.
    assert digits.num_train + digits.num_test == 1797
    assert digits.num_test == int(np.ceil(0.2 * 1797))
    assert digits.x_train.shape[1:] == (1, 8, 8) == digits.input_shape
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert digits.num_classes == 10 and digits.task == "classification"
    assert set(np.unique(digits.y_train)) == set(range(10))
    # Standardised with the scalar mean/std of the public test split (recomputed here from
    # sklearn's images and the same seeded stratified split): test is centred with unit std,
    # and train went through the same affine map.
    bunch = load_digits()
    idx_train, idx_test = _sorted_split(1797, 3, stratify=bunch.target)
    pixels_train = bunch.images[idx_train][:, None] / 16.0
    pixels_test = bunch.images[idx_test][:, None] / 16.0
    mean, std = pixels_test.mean(), pixels_test.std()
    assert digits.info["mean"] == pytest.approx(mean, rel=1e-12)
    assert digits.info["std"] == pytest.approx(std, rel=1e-12)
    assert "public test split" in digits.info["preprocessing"]
    assert abs(float(digits.x_test.mean())) < 1e-5
    assert float(digits.x_test.std()) == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(digits.x_test, (pixels_test - mean) / std, atol=1e-5)
    np.testing.assert_allclose(digits.x_train, (pixels_train - mean) / std, atol=1e-5)
    np.testing.assert_array_equal(digits.y_train, bunch.target[idx_train])
    assert abs(float(digits.x_train.mean())) < 0.1

def test_digits_split_is_seeded_and_stratified():
    a, b, c = load_dataset("digits", seed=1), load_dataset("digits", seed=1), load_dataset(
        "digits", seed=2
    )
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, c.y_test)
    # Stratified: every class keeps about the global 1/10 share in the test set.
    share = np.bincount(a.y_test, minlength=10) / a.num_test
    assert np.all(np.abs(share - 0.1) < 0.02)


def test_digits_pixels_recoverable_from_standardisation():
    digits = load_dataset("digits", seed=0)
    info = digits.info
    raw = digits.x_train * info["std"] + info["mean"]
    # Every pixel is k/16 for an integer k in 0..16, and the set of images is a subset of sklearn's.
    k = raw * 16
    np.testing.assert_allclose(k, np.round(k), atol=1e-3)
    reference = {img.tobytes() for img in load_digits().images.astype(np.int64)}
    sample = np.round(k[:50, 0]).astype(np.int64)
    assert all(img.tobytes() in reference for img in sample)


def test_breast_cancer_matches_sklearn_pipeline():
    from sklearn.datasets import load_breast_cancer

    data = load_dataset("breast-cancer", seed=7)
    assert data.num_train + data.num_test == 569
    assert data.input_shape == (30,) and data.num_classes == 2
    np.testing.assert_allclose(np.linalg.norm(data.x_train, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(data.x_test, axis=1), 1.0, atol=1e-5)

    bunch = load_breast_cancer()
    idx_train, idx_test = _sorted_split(569, 7, stratify=bunch.target)
    # StandardScaler fitted on the public test split (never on the private train split).
    scaler = StandardScaler().fit(bunch.data[idx_test])
    expected_train = Normalizer().transform(scaler.transform(bunch.data[idx_train]))
    expected_test = Normalizer().transform(scaler.transform(bunch.data[idx_test]))
    np.testing.assert_allclose(data.x_train, expected_train, atol=1e-5)
    np.testing.assert_allclose(data.x_test, expected_test, atol=1e-5)
    np.testing.assert_array_equal(data.y_train, bunch.target[idx_train])
    np.testing.assert_array_equal(data.y_test, bunch.target[idx_test])
    assert "public test split" in data.info["preprocessing"]


def test_diabetes_is_regression_standardised_with_test_stats():
    from sklearn.datasets import load_diabetes

    data = load_dataset("diabetes", seed=0)
    assert data.task == "regression" and data.num_classes is None
    assert data.num_train + data.num_test == 442 and data.input_shape == (10,)
    assert data.y_train.dtype == np.float32
    assert "public test split" in data.info["preprocessing"]
    bunch = load_diabetes(scaled=False)
    idx_train, idx_test = _sorted_split(442, 0)
    # Features: standardised with the public test split's statistics; test is centred with
    # unit std, train went through the same affine map.
    scaler = StandardScaler().fit(bunch.data[idx_test])
    np.testing.assert_allclose(data.x_test, scaler.transform(bunch.data[idx_test]), atol=1e-5)
    np.testing.assert_allclose(data.x_train, scaler.transform(bunch.data[idx_train]), atol=1e-5)
    np.testing.assert_allclose(data.x_test.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_test.std(axis=0), 1.0, atol=1e-5)
    # Target: likewise with the test targets' mean and std.
    y_mean, y_std = bunch.target[idx_test].mean(), bunch.target[idx_test].std()
    assert data.info["target_mean"] == pytest.approx(y_mean, rel=1e-12)
    assert data.info["target_std"] == pytest.approx(y_std, rel=1e-12)
    np.testing.assert_allclose(data.y_test, (bunch.target[idx_test] - y_mean) / y_std, atol=1e-5)
    np.testing.assert_allclose(data.y_train, (bunch.target[idx_train] - y_mean) / y_std,
                               atol=1e-5)
    # Undo the target scaling: every value must be one of sklearn's raw targets.
    raw_targets = set(np.round(load_diabetes().target).astype(int))
    restored = data.y_test * data.info["target_std"] + data.info["target_mean"]
    assert set(np.round(restored).astype(int)) <= raw_targets


def test_standardize_uses_only_the_public_test_split():
    rng = np.random.default_rng(0)
    x_test = rng.normal(size=(15, 4)) * [1.0, 3.0, 0.5, 0.0] + [0.0, -2.0, 7.0, 4.0]
    x_train_a = rng.normal(size=(40, 4)) * 5.0
    x_train_b = x_train_a.copy()
    x_train_b[:10] = rng.normal(size=(10, 4)) * 100.0 + 50.0  # other private records
    out_a = standardize(x_train_a, x_test, axis=0)
    out_b = standardize(x_train_b, x_test, axis=0)
    # mean, std and the standardised test split do not depend on the training split at all.
    for i in (1, 2, 3):
        np.testing.assert_array_equal(out_a[i], out_b[i])
    np.testing.assert_allclose(out_a[2], x_test.mean(axis=0), rtol=1e-12)
    # A constant test feature keeps std 1 (only centred) instead of dividing by 0.
    np.testing.assert_allclose(out_a[3], [*x_test[:, :3].std(axis=0), 1.0], rtol=1e-12)
    # Train rows change only where their input changed, through the test split's affine map.
    np.testing.assert_array_equal(out_a[0][10:], out_b[0][10:])
    assert not np.allclose(out_a[0][:10], out_b[0][:10])
    for x_train, (x_train_std, _, mean, std) in ((x_train_a, out_a), (x_train_b, out_b)):
        np.testing.assert_allclose(x_train_std, (x_train - mean) / std, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["breast-cancer", "diabetes"])
def test_loader_output_for_test_split_ignores_training_records(monkeypatch, name):
    """Replace the training records of the sklearn data set: the test split (and the diabetes
    target statistics) must come out bit-identical."""
    import sklearn.datasets

    loader_name = {"breast-cancer": "load_breast_cancer", "diabetes": "load_diabetes"}[name]
    original = getattr(sklearn.datasets, loader_name)
    reference = load_dataset(name, seed=5)
    bunch = original(**({"scaled": False} if name == "diabetes" else {}))
    stratify = bunch.target if name == "breast-cancer" else None
    idx_train, _ = _sorted_split(len(bunch.target), 5, stratify=stratify)
    data = bunch.data.copy()
    data[idx_train] = data[idx_train] * 3.0 + 10.0
    target = bunch.target.astype(np.float64).copy()
    if name == "diabetes":
        target[idx_train] += 100.0
    monkeypatch.setattr(sklearn.datasets, loader_name,
                        lambda **_: Bunch(data=data, target=target))
    changed = load_dataset(name, seed=5)
    np.testing.assert_array_equal(changed.x_test, reference.x_test)
    np.testing.assert_array_equal(changed.y_test, reference.y_test)
    assert not np.allclose(changed.x_train, reference.x_train)
    if name == "diabetes":
        assert changed.info["target_mean"] == reference.info["target_mean"]
        assert changed.info["target_std"] == reference.info["target_std"]
        np.testing.assert_allclose(changed.y_train - reference.y_train,
                                   100.0 / reference.info["target_std"], rtol=1e-4)


def test_unknown_dataset_names_the_value():
    with pytest.raises(DPDLError, match="no-such-set"):
        load_dataset("no-such-set")


def test_dataset_rejects_inconsistent_arrays():
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(DPDLError, match="y_train"):
        Dataset("bad", "classification", x, np.zeros(3, np.int64), x, np.zeros(4, np.int64),
                2, (3,))
    with pytest.raises(DPDLError, match="task"):
        Dataset("bad", "ranking", x, np.zeros(4), x, np.zeros(4), None, (3,))
