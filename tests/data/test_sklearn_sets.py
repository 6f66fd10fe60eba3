import numpy as np
import pytest
from sklearn.preprocessing import Normalizer, StandardScaler

from dpdl.data import Dataset, load_dataset
from dpdl.errors import DPDLError


def test_digits_shapes_counts_and_split():
    digits = load_dataset("digits", seed=3)
    # scikit-learn documents 1797 8x8 images of 10 classes; 20 % held out.
    assert digits.num_train + digits.num_test == 1797
    assert digits.num_test == int(np.ceil(0.2 * 1797))
    assert digits.x_train.shape[1:] == (1, 8, 8) == digits.input_shape
    assert digits.x_train.dtype == np.float32 and digits.y_train.dtype == np.int64
    assert digits.num_classes == 10 and digits.task == "classification"
    assert set(np.unique(digits.y_train)) == set(range(10))
    # Standardised with the train mean/std: train is centred with unit std, test roughly so.
    assert abs(float(digits.x_train.mean())) < 1e-5
    assert float(digits.x_train.std()) == pytest.approx(1.0, abs=1e-5)
    assert abs(float(digits.x_test.mean())) < 0.1


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
    from sklearn.datasets import load_digits

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
    from sklearn.model_selection import train_test_split

    data = load_dataset("breast-cancer", seed=7)
    assert data.num_train + data.num_test == 569
    assert data.input_shape == (30,) and data.num_classes == 2
    np.testing.assert_allclose(np.linalg.norm(data.x_train, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(data.x_test, axis=1), 1.0, atol=1e-5)

    bunch = load_breast_cancer()
    idx_train, idx_test = train_test_split(
        np.arange(569), test_size=0.2, random_state=7, stratify=bunch.target
    )
    idx_train, idx_test = np.sort(idx_train), np.sort(idx_test)
    scaler = StandardScaler().fit(bunch.data[idx_train])
    expected_train = Normalizer().transform(scaler.transform(bunch.data[idx_train]))
    expected_test = Normalizer().transform(scaler.transform(bunch.data[idx_test]))
    np.testing.assert_allclose(data.x_train, expected_train, atol=1e-5)
    np.testing.assert_allclose(data.x_test, expected_test, atol=1e-5)
    np.testing.assert_array_equal(data.y_train, bunch.target[idx_train])


def test_diabetes_is_regression_standardised_with_train_stats():
    from sklearn.datasets import load_diabetes

    data = load_dataset("diabetes", seed=0)
    assert data.task == "regression" and data.num_classes is None
    assert data.num_train + data.num_test == 442 and data.input_shape == (10,)
    assert data.y_train.dtype == np.float32
    np.testing.assert_allclose(data.x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(data.x_train.std(axis=0), 1.0, atol=1e-5)
    # Undo the target scaling: every value must be one of sklearn's raw targets.
    raw_targets = set(np.round(load_diabetes().target).astype(int))
    restored = data.y_test * data.info["target_std"] + data.info["target_mean"]
    assert set(np.round(restored).astype(int)) <= raw_targets


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
