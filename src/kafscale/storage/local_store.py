"""The local-directory backend of the ObjectStore contract (objectstore.py)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import fcntl
import hashlib
import itertools
import os
import shutil
import sys
import threading
from pathlib import Path

from kafscale.storage.objectstore import ObjectChangedError, ObjectExistsError, ObjectNotFound, ObjectStore, ObjectStoreError

# Temp file names: unique per process (pid) and per write (counter); O_EXCL catches the rest.
_TEMP_NAMES = itertools.count()


# An object's pages leave the page cache once it is durable (clean after the fsync, so
# nothing is written or waited for). Nobody reads them from there soon: the broker keeps the
# segments it writes in its own cache (storage/cache.py). Kept, they grow the page cache into
# memory the kernel has not handed out before, and copying into such pages cost ~8x the copy
# into pages used again (a VM faults each one in): most of the broker's CPU at 1 KiB and
# 16 KiB records (#33, docs/performance.md "Written pages out of the page cache"). Dropped,
# the next write reuses them; a read past the broker's cache comes from the disk. None
# where the platform lacks posix_fadvise.
_DROP_PAGES = getattr(os, "POSIX_FADV_DONTNEED", None) if hasattr(os, "posix_fadvise") else None
_READ_AHEAD = getattr(os, "POSIX_FADV_WILLNEED", None) if hasattr(os, "posix_fadvise") else None


def _advise(fd: int, offset: int, length: int, advice: int | None) -> None:
    """posix_fadvise, where there is one; advice only: a file system that refuses it fails
    no write or read."""
    if advice is not None:
        try:
            os.posix_fadvise(fd, offset, length, advice)
        except OSError:
            pass


def _write_all(fd: int, parts: list) -> None:
    """Write every part at the file position, in one writev when the kernel takes it all;
    an object of more than WRITE_BACK_BYTES a piece at a time, each piece sent to disk
    before the next is written (see _write_back)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    if _write_back is not None and WRITE_BACK_BYTES and sum(len(v) for v in views) > WRITE_BACK_BYTES:
        _write_in_pieces(fd, views)
        return
    _writev_all(fd, views)


def _writev_all(fd: int, views: list) -> None:
    while views:
        n = os.writev(fd, views[:_IOV_MAX])
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def _write_in_pieces(fd: int, views: list) -> None:
    at = 0
    i, cut = 0, 0  # the next view, and how much of it went in earlier pieces
    while i < len(views):
        piece, size = [], 0
        while i < len(views) and size < WRITE_BACK_BYTES:
            v = views[i][cut:] if cut else views[i]
            if size + len(v) > WRITE_BACK_BYTES:
                v = v[: WRITE_BACK_BYTES - size]
                cut += len(v)
            else:
                i, cut = i + 1, 0
            piece.append(v)
            size += len(v)
        _writev_all(fd, piece)
        _write_back(fd, at, size)
        _advise(fd, at, size, _DROP_PAGES)  # written back: the next piece takes these pages again
        at += size


# A large object (a merged segment, a large flush) is sent to disk a piece at a time as it
# is written: with the whole file dirty at its fsync, the file system's journal commit
# carries all its data, and every small flush fsyncing meanwhile (its own file, a directory,
# SQLite's WAL) waits for that commit: tens of ms for a 4 MiB merge (#33). The fsync after
# the last piece stays (it is what makes the object durable); the pieces only leave it
# nothing to write. Linux's sync_file_range; elsewhere the object goes in one write.
# (bench/bench_fsync_floor.py --merge-mib measures it.)
WRITE_BACK_BYTES = 1024 * 1024  # above it, pieces of it; a flush of up to 1 MiB (partition_log.ONE_JOB_MAX_BYTES) goes in one write


def _linux_libc_call(name: str, argtypes: list):
    """libc's `name` (it releases the GIL while it runs), or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


def _sync_file_range():
    fn = _linux_libc_call("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
    if fn is None:
        return None
    flags = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | _WRITE | _WAIT_AFTER

    def write_back(fd: int, offset: int, nbytes: int) -> None:
        fn(fd, offset, nbytes, flags)  # a failure (a file system without it) leaves the work to the fsync

    return write_back


_write_back = _sync_file_range()


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _umask_keeps_objects_readable() -> bool:
    """Whether files created with mode 0o644 get it whole under this process's umask (read
    from /proc without changing it: os.umask sets it for every thread). Where it cannot be
    told, no: the write path then sets the mode with an fchmod of its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o644 == 0
    except (OSError, ValueError):
        pass
    return False


_RENAME_NOREPLACE = 1


# renameat2(..., RENAME_NOREPLACE): a temp file takes its name only if the name is free, in
# one call where link + unlink took two. None where libc lacks it (then link + unlink).
_renameat2 = _linux_libc_call("renameat2", [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint])


class _DirHandles:
    """Open descriptors of the directories objects are written to, kept between writes: a
    flush creates its segment in its partition's directory by a name relative to the
    directory's descriptor and fsyncs that descriptor, with no open and close of the
    directory each time. Each of those calls is a syscall after which the writing thread
    waits for the GIL while the event loop works (#33). The store never removes a
    directory; if something else does, creating a file in it fails (ENOENT) and the handle
    is opened again by path (`forget`). At most `MAX_OPEN` kept; one in use is never closed."""

    MAX_OPEN = 256

    def __init__(self):
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}  # path -> fd, least recently used first
        self._users: dict[int, int] = {}  # fd -> threads using it now
        self._dropped: set[int] = set()  # no longer kept, closed when its last user gives it back

    def take(self, path: str) -> int:
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is not None:
                self._fds[path] = fd  # most recently used
                self._users[fd] = self._users.get(fd, 0) + 1
                return fd
        fd = _open_dir(path)
        with self._lock:
            if path in self._fds:  # another thread opened it meanwhile: use theirs
                os.close(fd)
                fd = self._fds[path]
            else:
                self._fds[path] = fd
            self._users[fd] = self._users.get(fd, 0) + 1
            self._close_idle_over_bound()
        return fd

    def give_back(self, fd: int) -> None:
        with self._lock:
            left = self._users[fd] - 1
            if left:
                self._users[fd] = left
            else:
                del self._users[fd]
                if fd in self._dropped:
                    self._dropped.discard(fd)
                    os.close(fd)
            self._close_idle_over_bound()

    def forget(self, path: str, fd: int) -> None:
        """The directory behind `fd` is gone: the next take opens `path` again."""
        with self._lock:
            if self._fds.get(path) == fd:
                del self._fds[path]
                self._dropped.add(fd)  # the caller still uses it

    def _close_idle_over_bound(self) -> None:
        over = len(self._fds) - self.MAX_OPEN
        if over <= 0:
            return
        for path in list(self._fds)[:over]:
            fd = self._fds[path]
            if fd not in self._users:
                del self._fds[path]
                os.close(fd)

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                if fd in self._users:
                    self._dropped.add(fd)
                else:
                    os.close(fd)
            self._fds.clear()


def _open_dir(path: str) -> int:
    """A directory's descriptor; the directory made (durably: _make_dirs) if missing."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        _make_dirs(Path(path))
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def _same_bytes(data: bytes, parts: list) -> bool:
    """Whether `data` is the concatenation of `parts`, without joining them."""
    views = [memoryview(p).cast("B") for p in parts]
    if len(data) != sum(len(v) for v in views):
        return False
    at = 0
    for v in views:
        if data[at : at + len(v)] != v:
            return False
        at += len(v)
    return True


def _same_or_taken(key: str, existing: bytes, parts: list) -> None:
    """A create found its key taken: fine if by these bytes (a retry of its own), else
    another writer's object (ObjectExistsError)."""
    if not _same_bytes(existing, parts):
        raise ObjectExistsError(f"create {key}: the key holds another writer's object")


def _fsync_dir(path) -> None:
    """Make the names in a directory durable: a file fsynced and renamed (or linked) into
    place survives power loss only once its directory is fsynced too."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """mkdir -p, each directory created made durable in its parent (fsync of the parent),
    so the first object of a new partition does not vanish with its directory."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        _fsync_dir(d.parent)


class LocalObjectStore(ObjectStore):
    """A directory as object store: the embedded default.

    Writes go to a temp file, are fsynced and renamed into place, so a reader or a crash
    never sees half an object; then the directory is fsynced, so a written object survives
    power loss (tests/test_durability_syscalls.py traces these fsyncs).
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._root = str(self.root)
        self._set_mode = not _umask_keeps_objects_readable()  # else 0o644 at creation is enough
        self._dirs = _DirHandles()

    def _path(self, key: str) -> Path:
        return Path(self._file(key))

    def _file(self, key: str) -> str:
        """The key's path as a string: the write path joins and splits names as strings
        (pathlib's parsing, hashing and str() were ~7 % of the broker's CPU under a
        single producer's large flushes, #33)."""
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return f"{self._root}/{key}"

    def _new_temp(self, key: str, parts: list) -> tuple[str, str]:
        """(the key's path, a temp file beside it holding `parts`, fsynced): every write
        goes to a temp file that is fsynced before it takes the key's name, so readers never
        see half. One open, one writev and one fsync per object: a flush creates an object
        per segment, many per second on a local disk, so this path is kept lean (no
        tempfile name generation, no mkdir unless the directory is missing)."""
        path = self._file(key)
        tmp = f"{os.path.dirname(path)}/.tmp-{os.getpid()}-{next(_TEMP_NAMES)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            _make_dirs(Path(path).parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            self._fill(fd, parts)
        except BaseException:
            os.close(fd)
            self._discard(tmp)
            raise
        os.close(fd)
        return path, tmp

    def _fill(self, fd: int, parts: list) -> None:
        """A new temp file's mode, bytes and fsync, then its pages out of the page cache."""
        if self._set_mode:
            os.fchmod(fd, 0o644)  # whatever the umask: readable as objects always were
        _write_all(fd, parts)
        os.fsync(fd)
        _advise(fd, 0, 0, _DROP_PAGES)

    @staticmethod
    def _discard(tmp: str) -> None:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass

    def _put_sync(self, key: str, parts: list, sync_dir: bool = True) -> str:
        """Write the object; its directory is fsynced unless the caller does it (`sync_dir`
        False: once for several objects of one directory). Returns the object's path."""
        path, tmp = self._new_temp(key, parts)
        try:
            os.replace(tmp, path)
        except BaseException:
            self._discard(tmp)
            raise
        if sync_dir:
            _fsync_dir(os.path.dirname(path))
        return path

    @staticmethod
    def _sync_dirs(paths: list[str]) -> None:
        for d in dict.fromkeys(os.path.dirname(p) for p in paths):
            _fsync_dir(d)

    async def put(self, key: str, parts: list) -> None:
        try:
            await asyncio.to_thread(self._put_sync, key, parts)
        except OSError as e:
            raise ObjectStoreError(f"put {key}: {e}") from e

    async def put_many(self, objects: list[tuple[str, list]]) -> None:
        # One worker-thread hop for the segment and its index, not one each.
        def put_all() -> None:
            self._sync_dirs([self._put_sync(key, parts, sync_dir=False) for key, parts in objects])

        try:
            await asyncio.to_thread(put_all)
        except OSError as e:
            raise ObjectStoreError(f"put {objects[0][0]}: {e}") from e

    def _create_sync(self, key: str, parts: list) -> str:
        """Temp file, fsync, then link(2) into place: the link fails if the name exists,
        so of two writers exactly one creates the object, and readers never see half.
        The caller fsyncs the directory. Returns the object's path."""
        path, tmp = self._new_temp(key, parts)
        try:
            try:
                os.link(tmp, path)
            except FileExistsError:
                with open(path, "rb") as existing:
                    _same_or_taken(key, existing.read(), parts)
        finally:
            self._discard(tmp)
        return path

    async def create(self, key: str, parts: list) -> None:
        await self.create_many([(key, parts)])

    async def create_many(self, objects: list[tuple[str, list]]) -> None:
        # One worker-thread hop, as put_many.
        await asyncio.to_thread(self._create_many_sync, objects)

    def _create_many_sync(self, objects: list[tuple[str, list]]) -> None:
        """The index only once the segment is ours; one directory fsync for both. Objects
        of one directory (a segment and its index, always) are written by names relative to
        its kept descriptor (_DirHandles), as few syscalls as the steps take."""
        first = self._file(objects[0][0])
        directory = os.path.dirname(first)
        if _renameat2 is None or any(os.path.dirname(self._file(key)) != directory for key, _ in objects[1:]):
            return self._create_many_by_path(objects)
        try:
            for attempt in (1, 2):
                dir_fd = self._dirs.take(directory)
                try:
                    try:
                        self._create_at(dir_fd, objects[0][0], os.path.basename(first), objects[0][1])
                    except FileNotFoundError:  # the directory was removed behind the kept handle
                        self._dirs.forget(directory, dir_fd)
                        if attempt == 2:
                            raise
                        continue
                    for key, parts in objects[1:]:
                        tmp = self._temp_at(dir_fd, parts)
                        try:
                            os.replace(tmp, os.path.basename(self._file(key)), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                        except BaseException:
                            self._discard_at(dir_fd, tmp)
                            raise
                    os.fsync(dir_fd)
                    return
                finally:
                    self._dirs.give_back(dir_fd)
        except ObjectExistsError:
            raise
        except OSError as e:
            raise ObjectStoreError(f"create {objects[0][0]}: {e}") from e

    def _temp_at(self, dir_fd: int, parts: list) -> str:
        """A temp file in the directory of `dir_fd` holding `parts`, fsynced: its name."""
        tmp = f".tmp-{os.getpid()}-{next(_TEMP_NAMES)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        try:
            self._fill(fd, parts)
        except BaseException:
            os.close(fd)
            self._discard_at(dir_fd, tmp)
            raise
        os.close(fd)
        return tmp

    @staticmethod
    def _discard_at(dir_fd: int, tmp: str) -> None:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass

    def _create_at(self, dir_fd: int, key: str, name: str, parts: list) -> None:
        """The object `name` in the directory of `dir_fd`, created from a fsynced temp file
        that takes the name only if it is free (renameat2 RENAME_NOREPLACE): of two writers
        exactly one creates it; the other's bytes must be the same (ObjectExistsError)."""
        tmp = self._temp_at(dir_fd, parts)
        try:
            if _renameat2(dir_fd, tmp.encode(), dir_fd, name.encode(), _RENAME_NOREPLACE) == 0:
                return
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                _same_or_taken(key, self._read_at(dir_fd, name), parts)
            elif err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without it
                try:
                    os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except FileExistsError:
                    _same_or_taken(key, self._read_at(dir_fd, name), parts)
            else:
                raise OSError(err, os.strerror(err), name)
        except BaseException:
            self._discard_at(dir_fd, tmp)
            raise
        self._discard_at(dir_fd, tmp)  # the name was taken (the same bytes) or linked

    @staticmethod
    def _read_at(dir_fd: int, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read()
        finally:
            os.close(fd)

    def _create_many_by_path(self, objects: list[tuple[str, list]]) -> None:
        try:
            paths = [self._create_sync(*objects[0])]
            paths += [self._put_sync(key, parts, sync_dir=False) for key, parts in objects[1:]]
            self._sync_dirs(paths)
        except ObjectExistsError:
            raise
        except OSError as e:
            raise ObjectStoreError(f"create {objects[0][0]}: {e}") from e

    def blocking_create_many(self, objects: list[tuple[str, list]]):
        # A subclass or an instance that changes how creates go (tests' failing stores)
        # keeps its own way: the blocking call is the plain create_many's.
        if getattr(self.create_many, "__func__", None) is not LocalObjectStore.create_many:
            return None
        return lambda: self._create_many_sync(objects)

    @staticmethod
    def _version(data: bytes) -> str:
        # The bytes themselves, by digest: an object of other bytes can never pass for the
        # expected one (an inode or mtime can be reused), and the same bytes are the same
        # object to a merge, which is all the token guards.
        return f"{len(data)}-{hashlib.sha256(data).hexdigest()}"

    def _get_with_version_sync(self, key: str) -> tuple[bytes, str]:
        data = self._get_sync(key, 0, None)
        return data, self._version(data)

    async def get_with_version(self, key: str) -> tuple[bytes, str]:
        try:
            return await asyncio.to_thread(self._get_with_version_sync, key)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise ObjectStoreError(f"get {key}: {e}") from e

    def _replace_sync(self, key: str, parts: list, expected: str) -> None:
        """Temp file and fsync outside the lock; then, holding an exclusive flock on the
        key's directory (every replacer of this store takes it, in this process or another
        on this machine), compare the current object with `expected` and rename over it."""
        path, tmp = self._new_temp(key, parts)
        try:
            dir_fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                try:
                    current = self._get_sync(key, 0, None)
                except ObjectNotFound:
                    raise ObjectChangedError(f"replace {key}: the object is gone") from None
                # The object there is what the rewrite read (small, the run's first segment)
                # or, after a retry, already ours: only the former is hashed. Hashing (and
                # joining) the new object each time was 4 % of the broker's CPU under a
                # saturated load, the merger's (#33).
                if self._version(current) != expected:
                    if _same_bytes(current, parts):
                        return  # already these bytes
                    raise ObjectChangedError(f"replace {key}: the key holds another version than expected")
                os.replace(tmp, path)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)  # releases the lock
        finally:
            self._discard(tmp)

    async def replace(self, key: str, parts: list, expected: str) -> None:
        try:
            await asyncio.to_thread(self._replace_sync, key, parts, expected)
        except ObjectChangedError:
            raise
        except OSError as e:
            raise ObjectStoreError(f"replace {key}: {e}") from e

    def _get_sync(self, key: str, start: int, end: int | None) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                if end is None or end > start:
                    # Written objects are not in the page cache (_DROP_PAGES): ask for the
                    # whole range at once rather than a readahead window at a time.
                    _advise(f.fileno(), start, 0 if end is None else end - start, _READ_AHEAD)
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            return await asyncio.to_thread(self._get_sync, key, start, end)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise ObjectStoreError(f"get {key}: {e}") from e

    async def _each_found_in_thread(self, calls: list) -> list:
        """The calls (small local reads) in one thread hop, a hop per file costing more than
        the read; None for an object not found."""
        def run() -> list:
            out = []
            for call in calls:
                try:
                    out.append(call())
                except ObjectNotFound:
                    out.append(None)
            return out

        try:
            return await asyncio.to_thread(run)
        except OSError as e:
            raise ObjectStoreError(f"get: {e}") from e

    async def get_many(self, requests: list[tuple[str, tuple[int, int] | None]], concurrency: int = 32) -> list[bytes | None]:
        return await self._each_found_in_thread([lambda k=k, r=r: self._get_sync(k, *(r or (0, None))) for k, r in requests])

    def _get_tail_sync(self, key: str, nbytes: int) -> tuple[bytes, int]:
        try:
            with open(self._path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - nbytes))
                return f.read(), size
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    async def get_tails(self, keys: list[str], nbytes: int, concurrency: int = 32) -> list[tuple[bytes, int] | None]:
        return await self._each_found_in_thread([lambda k=k: self._get_tail_sync(k, nbytes) for k in keys])

    async def get_tail(self, key: str, nbytes: int) -> tuple[bytes, int]:
        try:
            return await asyncio.to_thread(self._get_tail_sync, key, nbytes)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise ObjectStoreError(f"get {key}: {e}") from e

    def _copy_sync(self, source: str, target: str) -> None:
        """Copied by the kernel (copy_file_range/sendfile) into a temp file beside the
        target, fsynced, then renamed over it, as every write here."""
        path = self._path(target)
        tmp = f"{path.parent}/.tmp-{os.getpid()}-{next(_TEMP_NAMES)}"
        try:
            src = open(self._path(source), "rb")
        except FileNotFoundError:
            raise ObjectNotFound(source) from None
        with src:
            _make_dirs(path.parent)
            try:
                with open(tmp, "xb") as dst:
                    shutil.copyfileobj(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, path)
                _fsync_dir(path.parent)
            except BaseException:
                self._discard(tmp)
                raise

    async def copy(self, source: str, target: str) -> None:
        try:
            await asyncio.to_thread(self._copy_sync, source, target)
        except ObjectNotFound:
            raise
        except OSError as e:
            raise ObjectStoreError(f"copy {source} to {target}: {e}") from e

    def _delete_sync(self, keys: list[str]) -> None:
        # Under the directory lock `replace` holds, as on S3: a replace compared before the
        # delete must not rename its object back in after it.
        by_dir: dict[Path, list[Path]] = {}
        for key in keys:
            path = self._path(key)
            by_dir.setdefault(path.parent, []).append(path)
        for parent, paths in by_dir.items():
            try:
                dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                for path in paths:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
            finally:
                os.close(dir_fd)

    async def delete(self, keys: list[str]) -> None:
        await asyncio.to_thread(self._delete_sync, keys)

    def _list_sync(self, prefix: str, sizes: bool = False):
        """Sorted keys under prefix; with `sizes`, {key: size} instead."""
        base = self._path(prefix.rsplit("/", 1)[0]) if "/" in prefix else self.root
        out = []
        if not base.exists():
            return {} if sizes else out
        for dirpath, _dirs, files in os.walk(base):
            rel = os.path.relpath(dirpath, self.root)  # once per directory, not per file
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                key = rel + name
                if key.startswith(prefix):
                    out.append(key)
        if not sizes:
            return sorted(out)
        found = {}
        for key in out:
            try:
                found[key] = os.stat(self.root / key).st_size
            except FileNotFoundError:
                pass  # deleted meanwhile
        return found

    async def list(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(self._list_sync, prefix)

    async def list_sizes(self, prefix: str) -> dict[str, int]:
        return await asyncio.to_thread(self._list_sync, prefix, True)

    async def close(self) -> None:
        self._dirs.close()

    async def check(self) -> None:
        if not self.root.is_dir() or not os.access(self.root, os.W_OK):
            raise ObjectStoreError(f"{self.root} is not a writable directory")
