"""Your own images: a folder with train/<class>/, test/<class>/ and optionally val/<class>/ image files."""

import ctypes
import hashlib
import os
import signal
import stat
import sys
import threading
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image, ImageOps
from torchvision.datasets.folder import IMG_EXTENSIONS

from datamodules.base import DataSetupError, ImageDataModule
from datamodules.processes import alive

# Images per task of the decoding pool. Fewer than two tasks' worth decode in this process: starting
# worker processes costs more than they save.
CHUNK = 1000

# --- decoding one image ----------------------------------------------------------------------------

# PIL modes with an alpha channel; "P", "L" and "RGB" images may also have a transparent colour.
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")


def integer_depth(image: Image.Image) -> tuple[int, bool]:
    """How many bits the values of an integer image ("I", "I;16...") have, and whether they are signed."""
    tags = getattr(image, "tag_v2", None)  # a TIFF says (a 12-bit camera image is stored as "I;16")
    if tags is not None and 258 in tags:  # BitsPerSample, SampleFormat (2: signed), one per channel
        bits, sample_format = (v[0] if isinstance(v, tuple) else v for v in (tags[258], tags.get(339, 1)))
        return int(bits), sample_format == 2
    if image.mode.startswith("I;16"):
        return 16, image.mode.endswith("S")
    # The other formats PIL opens as "I" hold 16-bit values: PNG (older Pillows open 16-bit grey as "I",
    # newer as "I;16"), and PGM/PPM, whose values Pillow scales from the file's maxval to 0..65535.
    return 16, False


def to_8bit(image: Image.Image) -> tuple[Image.Image, str]:
    """A high-bit-depth image ("I;16...", "I", "F") as an "L" image, and a note if values were clipped.

    PIL's own convert("L") clips these to 0..255: a 16-bit PNG came out 99.6% white. Integers are scaled
    by their bit depth, keeping the high 8 bits (65535 -> 255), as torchvision's ToDtype(torch.uint8,
    scale=True) does, and as PIL itself reads a 16-bit RGB PNG (so its grey twin decodes alike); negative
    values are clipped to 0. Floats are on the 0..1 scale, as torchvision's ToTensor leaves them and
    ToDtype reads them (x 255.999, truncated: 256 equal bins); outside 0..1 they are clipped. Not min-max
    per image: that would make a dark and a bright picture of one thing alike, and blow up the noise of a
    blank one. The note lets the caller warn about values that do not fit the convention.
    """
    values = np.asarray(image)
    if image.mode == "F":
        finite = np.nan_to_num(values.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        low, high = float(np.nanmin(values)), float(np.nanmax(values))
        clipped = not (0 <= low and high <= 1) or np.isnan(values).any()
        out = (np.clip(finite, 0, 1) * (256 - 1e-3)).astype(np.uint8)
        return Image.fromarray(out, "L"), f"float values {low:g}..{high:g}" if clipped else ""
    bits, signed = integer_depth(image)
    values = values.astype(np.int64)
    if bits == 32 and not signed:
        values &= 0xFFFFFFFF  # PIL holds unsigned 32-bit values in int32: undo the wrap-around
    top = 2 ** (bits - signed) - 1
    low, high = int(values.min()), int(values.max())
    shift = bits - signed - 8
    scaled = np.clip(values, 0, top)
    out = (scaled >> shift if shift >= 0 else scaled << -shift).astype(np.uint8)
    clipped = low < 0 or high > top
    return Image.fromarray(out, "L"), f"{bits}-bit values {low}..{high}" if clipped else ""


def open_image(path: Path, mode: str) -> tuple[Image.Image, str]:
    """The image file at `path` decoded in PIL `mode` ("L" or "RGB"), and a note if values were clipped.

    Whatever PIL opens it as: high bit depths are scaled (`to_8bit`), and transparent pixels are shown
    over white, as a viewer shows them (dropping the alpha channel, as convert() does, shows whatever
    colour they hide: often black, so a black glyph on a transparent background vanished). A
    DataSetupError naming the file if it is broken.
    """
    try:
        with Image.open(path) as image:
            image.load()  # reads the whole file: this is where a truncated one fails
            note = ""
            if image.mode in ("I", "F") or image.mode.startswith("I;16"):
                image, note = to_8bit(image)
            elif image.mode in ALPHA_MODES or "transparency" in image.info:
                rgba = image.convert("RGBA")
                image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
            return image.convert(mode), note
    except Exception as e:  # PIL reports broken files as OSError, SyntaxError, ValueError, zlib errors...
        raise DataSetupError(f"cannot read the image {path} ({type(e).__name__}: {e}); "
                             f"replace or remove it") from None


def read_images(paths: list[Path], mode: str, size: tuple[int, int], resize: bool) -> tuple[np.ndarray, list[str]]:
    """Decode image files into one uint8 array (n, H, W, C), and notes "PATH (what was clipped)".

    `size` is (width, height), as PIL has it. With `resize`, each image is scaled so that it covers
    `size` and centre-cropped to it (torchvision's Resize + CenterCrop); without, every image must
    already have that size. A module-level function, so that worker processes can run it.
    """
    out = np.empty((len(paths), size[1], size[0], len(mode)), dtype=np.uint8)
    notes = []
    for i, path in enumerate(paths):
        image, note = open_image(path, mode)
        if note:
            notes.append(f"{path} ({note})")
        if resize and image.size != size:
            image = ImageOps.fit(image, size, Image.Resampling.BILINEAR)
        if image.size != size:
            raise DataSetupError(f"{path} is {image.size[0]}x{image.size[1]} pixels, unlike the "
                                 f"{size[0]}x{size[1]} of the first training image; pass --data.image_size N "
                                 f"to resize every image to NxN")
        out[i] = np.asarray(image).reshape(out.shape[1:])
    return out, notes


def all_grey(images: np.ndarray, chunk: int = 4096) -> bool:
    """Whether R = G = B in every pixel of (n, H, W, 3) images (in chunks: one comparison can be huge)."""
    parts = (images[i:i + chunk] for i in range(0, len(images), chunk))
    return all((part[..., :1] == part).all() for part in parts)


# --- listing the files -----------------------------------------------------------------------------

@dataclass
class SplitFiles:
    """What listing one split found: per class, its image files as (folder, name); links not read again
    (the link, or the path where a loop was found); files that are not images."""

    classes: list[list[tuple[str, str]]]
    skipped: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def list_splits(root: Path, splits: dict[str, list[str]]) -> dict[str, SplitFiles]:
    """The files of root/<split>/<class>/ for each split and its classes, each real folder and file once.

    Links are followed (a class folder, or folders in it, may be links to images kept elsewhere), but a
    link to a folder already read is not read again: `train/cat/up -> ..` made os.walk(followlinks=True)
    read cat 40 times. A file, too, counts once (by device and inode): one image under two labels, twice
    under one, or in train and test alike only misleads. What is reached without links belongs where it
    lies, so a link in cat to dog's folder does not take dog's images, nor one in train test's: the real
    folders of every split are read first, then the links, each split and class in ImageFolder's order.
    The root and the split folders count as read, so a link to them reads nothing.
    """
    seen: set[tuple[int, int]] = set()  # (device, inode) of the folders and image files read

    def visit(path: str, via: str | None, out: SplitFiles, label: int, links: list | None) -> None:
        # links: where to put the links found, to follow later; None: follow them now (`via` one).
        try:
            st = os.stat(path)
        except OSError:  # a dangling link: listed, so that the data module reports it as not a file
            st = None
        is_dir = st is not None and stat.S_ISDIR(st.st_mode)
        if not is_dir and not path.lower().endswith(IMG_EXTENSIONS):
            out.ignored.append(path)
        elif st is not None and (st.st_dev, st.st_ino) in seen:
            out.skipped.append(via or path)
        elif not is_dir:
            if st is not None:
                seen.add((st.st_dev, st.st_ino))
            out.classes[label].append(os.path.split(path))
        else:
            seen.add((st.st_dev, st.st_ino))
            try:
                entries = sorted(os.scandir(path), key=lambda e: e.name)
            except OSError:
                return  # an unreadable folder: os.walk skips it too
            for entry in entries:
                if links is not None and entry.is_symlink():
                    links.append(entry.path)
                else:
                    visit(entry.path, via, out, label, links)

    for folder in [root, *(root / split for split in splits)]:
        st = folder.stat()
        seen.add((st.st_dev, st.st_ino))
    found = {split: SplitFiles([[] for _ in classes]) for split, classes in splits.items()}
    links = {split: [[] for _ in classes] for split, classes in splits.items()}
    for split, classes in splits.items():  # the real folders first: what lies in them is theirs
        for label, name in enumerate(classes):
            visit(str(root / split / name), None, found[split], label, links[split][label])
    for split, classes in splits.items():  # then the links found in them, followed all the way
        for label in range(len(classes)):
            for link in links[split][label]:
                visit(link, link, found[split], label, None)
    for files in found.values():
        files.classes = [sorted(pairs) for pairs in files.classes]  # as torchvision sorts os.walk's
        files.skipped = list(dict.fromkeys(files.skipped))
    return found


# --- the decoding pool -----------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>



def _die_with_parent() -> None:
    """Have this process killed when its parent dies: prctl(PR_SET_PDEATHSIG) on Linux, a watcher elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                          ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0:
                return
        except (OSError, AttributeError):
            pass
    parent = os.getppid()

    def watch():  # when the parent dies, the process is handed to another: its parent pid changes
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def init_worker(main_pid: int) -> None:
    """Set up a decoding worker process: deaf to Ctrl-C, and gone when the main process is."""
    # Ctrl-C in a terminal signals the whole process group. A worker interrupted while it waits for a task
    # can die holding the task queue's lock and leave the rest waiting forever (once in five tries, a
    # 16-minute hang). The main process alone handles Ctrl-C, and terminates the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the main process's handler of SIGTERM (see `sigterm_raises`): a worker
    # must simply die when the main process terminates it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # After a SIGTERM or SIGKILL of the main process nobody would stop a worker, and it would wait for tasks
    # forever: the task queue's pipe stays open in its siblings.
    _die_with_parent()
    if os.getppid() != main_pid and not alive(main_pid):
        os._exit(1)  # the main process died before we asked to die with it


@contextmanager
def sigterm_raises():
    """Within: SIGTERM raises SIGTERMException (exit code 143) in the main thread, at once.

    So that a pool of workers is stopped as on Ctrl-C. A Python handler already set (Lightning's, which
    tells DDP's other processes) runs first; an ignored SIGTERM stays ignored. Elsewhere than in the main
    thread signals cannot be handled, and workers die with their parent anyway.
    """
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return

    def handler(signum, frame):
        if callable(previous):
            previous(signum, frame)
        raise SIGTERMException(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once: cancel the work not started, and terminate the workers mid-task."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public way before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=2)
        if process.is_alive():
            process.kill()
            process.join(timeout=2)


def map_in_processes(function, tasks: list, workers: int) -> list:
    """[function(task) for task in tasks] in `workers` processes, which never outlive this call.

    On Ctrl-C, SIGTERM or an error the pool is stopped at once (the pending tasks are not waited for) and the
    exception goes on; SIGTERM raises SIGTERMException (see `sigterm_raises`).
    """
    pool = ProcessPoolExecutor(workers, initializer=init_worker, initargs=(os.getpid(),))
    try:
        with sigterm_raises():
            results = list(pool.map(function, tasks))
    except BrokenProcessPool:
        stop_pool(pool)
        raise DataSetupError("a process decoding the images died (killed, or out of memory?); run again, "
                             "or with fewer CPU cores (taskset) if memory is short") from None
    except BaseException:
        stop_pool(pool)
        raise
    pool.shutdown()
    return results


class ImageFolderDataModule(ImageDataModule):
    """A folder of your own images (`--data image_folder --data.root DIR`).

    DIR/train/<class>/*, DIR/test/<class>/* and optionally DIR/val/<class>/* (without it, a seeded
    `val_size` split of train validates). The class names and their order are the sorted folder names
    of DIR/train, as in `torchvision.datasets.ImageFolder` (hidden folders are skipped); test and val must
    have the same folders.
    Files that are not images (by extension: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp) are
    ignored with a warning. Links are followed, but every real folder and file is read once: a link loop,
    or a link to another class's (or split's) images, is skipped with a warning naming it.
    16-bit and 32-bit images are scaled by their bit depth, float ones from 0..1 (values outside are
    clipped, with a warning); transparent pixels are shown over white.

    The images are decoded once, by all CPU cores, into the uint8 cache in `data_dir/cache/` (not in
    DIR, which may be read-only); it is rebuilt when a file in DIR is added, removed or changed.

    Args:
        root: the folder holding train/ and test/.
        image_size: resize (the shorter side, then a centre crop) every image to image_size x
            image_size; needed when the images differ in size.
        channels: 1 (grey) or 3 (RGB); by default 1 if every training image is grey, else 3.
        val_size: images split off train for validation when there is no val/ folder; by default a
            tenth of the training images, at most 5000 (CIFAR-10's split for 50,000).

    No augmentation by default (only you know whether a mirrored image is still the same class); the
    `--model cnn` recipe turns on its crops and flips, as for any data set. The other arguments are
    ImageDataModule's.
    """

    name = "image_folder"

    def __init__(self, root: str, image_size: PositiveInt | None = None,
                 channels: Literal[1, 3] | None = None, val_size: PositiveInt | None = None, **kwargs):
        # Nothing here may raise a DataSetupError: the CLI would report it with a traceback. The folder is
        # first looked at when the CLI links `classes` and `image_shape` into the model.
        super().__init__(val_size=val_size, **kwargs)
        self.root = Path(root).expanduser().resolve()
        self.image_size, self.channels = image_size, channels
        self._classes: list[str] | None = None
        self._image_shape: tuple[int, int, int] | None = None
        self._files: dict[str, tuple[list[Path], list[int]]] = {}

    @property
    def classes(self) -> list[str]:
        if self._classes is None:
            self._classes = self._class_folders("train")
        return self._classes

    @property
    def image_shape(self) -> tuple[int, int, int]:
        # Only the images say how big they are and whether they are grey: the first look decodes the
        # training split into the cache, and later runs read it from there.
        if self._image_shape is None:
            self._image_shape = tuple(self.load_split("train")["images"].shape[1:])
        return self._image_shape

    @property
    def has_validation_split(self) -> bool:
        return (self.root / "val").is_dir()

    def _class_folders(self, split: str) -> list[str]:
        folder = self.root / split
        if not folder.is_dir():
            raise DataSetupError(f"there is no folder {folder}: --data.root must hold train/<class>/ and "
                                 f"test/<class>/ folders of images (and optionally val/<class>/)")
        # Hidden folders (.ipynb_checkpoints, say) are not classes.
        classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise DataSetupError(f"{folder} has no class folders: put the images of each class in a folder "
                                 f"named after it, {folder}/<class>/")
        return classes

    def _list(self, split: str) -> tuple[list[Path], list[int]]:
        """The image files of `split` in ImageFolder's order, with their labels; listed once per run.

        Every split is listed at once: a link from one split into another is then found and not read.
        """
        if not self._files:
            self._list_all()
        return self._files[split]

    def _list_all(self) -> None:
        splits = {}
        for split in ("train", "val", "test") if self.has_validation_split else ("train", "test"):
            classes = self._class_folders(split)
            if classes != self.classes:
                missing, extra = set(self.classes) - set(classes), set(classes) - set(self.classes)
                raise DataSetupError(f"{self.root / split} must have the same class folders as "
                                     f"{self.root / 'train'}"
                                     + (f"; missing: {', '.join(sorted(missing))}" if missing else "")
                                     + (f"; not in train: {', '.join(sorted(extra))}" if extra else ""))
            splits[split] = classes
        for split, found in list_splits(self.root, splits).items():
            folder, files, labels = self.root / split, [], []
            for label, (name, pairs) in enumerate(zip(splits[split], found.classes)):
                if not pairs:
                    linked = [p for p in found.skipped if Path(p).is_relative_to(folder / name)]
                    raise DataSetupError(f"the class folder {folder / name} has no images "
                                         f"({' '.join(IMG_EXTENSIONS)} files)"
                                         + (f"; it only links to images read already: {linked[0]} -> "
                                            f"{os.path.realpath(linked[0])}" if linked else ""))
                files += [Path(dirpath, filename) for dirpath, filename in pairs]
                labels += [label] * len(pairs)
            if found.skipped:
                named = ", ".join(f"{link} -> {os.path.realpath(link)}" for link in found.skipped[:3])
                more = f" and {len(found.skipped) - 3} more" if len(found.skipped) > 3 else ""
                warnings.warn(f"did not read {len(found.skipped)} links in {folder} again: they lead to folders or "
                              f"images read already (a loop, or a link to another class or split): {named}{more}")
            ignored = [e.path for e in os.scandir(folder) if e.is_file()] + found.ignored
            if ignored:
                warnings.warn(f"ignored {len(ignored)} files in {folder} that are not images in a class folder, "
                              f"e.g. {ignored[0]}")
            self._files[split] = files, labels

    def source_files(self, split: str) -> list[Path]:
        return self._list(split)[0]

    def cache_path(self, split: str) -> Path:
        # One cache per folder and decoding settings: two roots with the same name never share one.
        settings = repr((str(self.root), self.image_size, self.channels))
        tag = hashlib.sha1(settings.encode()).hexdigest()[:10]
        return self.data_dir / "cache" / f"{self.name}-{self.root.name}-{tag}-{split}.pt"

    def fetch(self) -> None:
        # Called when a listed file is not a readable file (a dangling link, say): nothing to download.
        missing = [str(f) for files, _ in self._files.values() for f in files if not f.is_file()]
        raise DataSetupError(f"cannot read the image {missing[0] if missing else self.root}: it is not a "
                             f"file (a broken link?); replace or remove it")

    def setup(self, stage: str | None = None):
        if self.val_size is None:
            self.val_size = min(5000, max(1, len(self.source_files("train")) // 10))
        super().setup(stage)

    def decode(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        files, labels = self._list(split)
        if split == "train":
            # RGB unless told otherwise; reduced to one channel below if every image turns out grey.
            mode = "L" if self.channels == 1 else "RGB"
            size = (self.image_size,) * 2 if self.image_size else open_image(files[0], mode)[0].size
        else:
            channels, height, width = self.image_shape  # the other splits follow the training images
            mode, size = ("L" if channels == 1 else "RGB"), (width, height)
        rank_zero_info(f"Decoding the {len(files):,} images in {self.root / split} (cached for later runs)")
        read = partial(read_images, mode=mode, size=size, resize=bool(self.image_size))
        chunks = [files[i:i + CHUNK] for i in range(0, len(files), CHUNK)]
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(cpus, len(chunks))
        # Processes, not threads: PIL holds the GIL for most of a small image's decode (CIFAR-10's JPEGs on
        # 2 cores: 2 threads were slower than 1, 2 processes 1.8x faster).
        parts = map_in_processes(read, chunks, workers) if workers > 1 else [read(files)]
        images = np.concatenate([part for part, _ in parts])
        clipped = [note for _, notes in parts for note in notes]
        if clipped:
            warnings.warn(f"{len(clipped)} images in {self.root / split} have values outside their format's "
                          f"range, clipped: {clipped[0]}. Integers are read by their bit depth, floats as "
                          f"0..1")
        if split == "train" and self.channels is None and all_grey(images):
            images = images[..., :1]
        return torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), torch.tensor(labels)
