"""IDX files (the MNIST format) and the Fashion-MNIST images in them, read from a local directory.

Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) has MNIST's format and size: 60,000 training and 10,000
test images of 28 x 28 = 784 pixels in ten classes, as four gzipped IDX files (Debian ships them
in the package ``dataset-fashion-mnist``).  Nothing is downloaded.  The binary split is the SEP
paper's odd-against-even one: odd class codes are +1, even ones -1; pixels are scaled to [0, 1].
"""

import gzip
import os

import numpy as np

#: the IDX files of each part, images then labels
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx(path: "str | os.PathLike[str]") -> np.ndarray:
    """An IDX array (magic 0x0000 08 NDIM, big-endian sizes, uint8 data), gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, file holds {data.size} values")
    return data.reshape(shape)


def load_fashion_mnist(data_dir: "str | os.PathLike[str] | None", part: str,
                       option: str = "data_dir") -> "tuple[np.ndarray, np.ndarray]":
    """(X in [0, 1], ±1 labels: odd class codes +1) of the "train" or "test" part.

    ``option`` names the argument or command-line option that gave ``data_dir``, for the messages.
    """
    if data_dir is None:
        raise ValueError(f"{option} is needed: the directory of the four Fashion-MNIST IDX files "
                         "(Debian package dataset-fashion-mnist)")
    images, labels = (os.path.join(data_dir, f) for f in FILES[part])
    for path in (images, labels):
        if not os.path.exists(path):
            raise FileNotFoundError(f"no {os.path.basename(path)} in {option} {data_dir}")
    X = read_idx(images)
    y = read_idx(labels)
    if X.ndim != 3 or y.ndim != 1 or len(X) != len(y):
        raise ValueError(f"{data_dir}: images {X.shape} and labels {y.shape} do not match")
    return X.reshape(len(X), -1).astype(np.float64) / 255.0, np.where(y % 2 == 1, 1.0, -1.0)
