"""The data modules' short names, as `--data NAME` takes them."""

DATA = {
    "cifar10": "datamodules.CIFAR10DataModule",
    "mnist": "datamodules.MNISTDataModule",
    "fashion_mnist": "datamodules.FashionMNISTDataModule",
    "image_folder": "datamodules.ImageFolderDataModule",
}


def class_path(name: str) -> str | None:
    """The class path of a short name, or None if it is not one."""
    return DATA.get(name)


def short_name(class_path: str) -> str:
    """The short name of a data module's class path (or its class name, for other classes)."""
    return next((name for name, path in DATA.items() if path == class_path), class_path.rsplit(".", 1)[-1])
