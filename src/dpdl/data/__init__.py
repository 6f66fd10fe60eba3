"""Data sets and their split across nodes (ARCHITECTURE.md, ``dpdl.data``).

``load_dataset(name, data_dir=None, download=False, seed=0)`` returns a :class:`Dataset`
for "digits", "breast-cancer", "diabetes" (scikit-learn, no download), "fashion-mnist"
(IDX files), "cifar10" (python pickle batches) or "csv:<path>".
``partition`` splits record indices over nodes; ``stack_node_data`` pads them into stacked
(n, J_max, ...) arrays with a validity mask for the simulator.
"""

from dpdl.data.cifar10 import download_cifar10, find_cifar10, load_cifar10, read_batch
from dpdl.data.csv_loader import load_csv
from dpdl.data.dataset import Dataset
from dpdl.data.fashion_mnist import find_fashion_mnist, load_fashion_mnist
from dpdl.data.idx import parse_idx, read_idx, write_idx
from dpdl.data.nodes import local_arrays, read_records, stack_local_datasets
from dpdl.data.partition import SCHEMES, label_distribution, partition, stack_node_data
from dpdl.data.registry import dataset_names, load_dataset, register_loader
from dpdl.data.sklearn_sets import load_breast_cancer, load_diabetes, load_digits

__all__ = [
    "SCHEMES",
    "Dataset",
    "dataset_names",
    "download_cifar10",
    "find_cifar10",
    "find_fashion_mnist",
    "label_distribution",
    "load_breast_cancer",
    "load_cifar10",
    "load_csv",
    "load_dataset",
    "load_diabetes",
    "load_digits",
    "load_fashion_mnist",
    "local_arrays",
    "parse_idx",
    "partition",
    "read_batch",
    "read_records",
    "read_idx",
    "register_loader",
    "stack_node_data",
    "stack_local_datasets",
    "write_idx",
]
