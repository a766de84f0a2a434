"""LMDB's on-disk format, checked from Python before liblmdb reads a database.

liblmdb maps the file and trusts every byte of it: a page past the end of a cut file, a
key or value size that runs off its page, a run of overflow pages longer than the file is
a read outside the mapped file, and the process dies of SIGBUS or SIGSEGV without a word.
:func:`check` reads what an import's reads rely on, in one pass over the pages the import
reads anyway, and turns any of it into one :class:`InputError` naming the file and the
page:

- both meta pages (page numbers 0 and 1, the meta flag, LMDB's magic and data version, a
  page size that is a power of two and the same in both); the newer one, the one LMDB
  reads, for the main database's flags, depth and root and the last page in use (the file
  must hold it);
- every page of the main database's B-tree, level by level from its root: the page number
  in its header is its place in the file, its flags are a branch or a leaf page at the
  level its kind says (branches above, leaves at the database's depth), it lies within the
  pages in use and is named once (no cycle); its free-space bounds fit the page and every
  node (key, and value unless the value is on overflow pages) lies within its page;
- every value on overflow pages: its first page within the pages in use, that page's
  header (page number, the overflow flag) and a run at least as long as the value, within
  the pages in use;
- sorted duplicates (``MDB_DUPSORT``, which py-lmdb cannot write to the main database but
  a C writer can): inline sub-pages fit their node; sub-databases are walked as above;
- the counts the meta page records (branch, leaf and overflow pages, entries) equal what
  the walk found: a split into key ranges counts on the entries.

The walk reads each tree page once and refuses a page named twice, so it is linear in the
file; it works on all the pages of a level at once with numpy (a few array operations per
level, none per node), through a read-only map of the file that nothing reads past the
last whole page of. What LMDB never reads for a read (the free-page database, the map size
and address, keys' order) is not checked. Both layouts py-lmdb reads are known: LMDB 0.9
(16-byte page headers, data version 1) and 1.0 (24-byte headers with the transaction id,
node offsets from the header's end, data version 3), 64-bit little-endian; the byte layout
is ``MDB_page``, ``MDB_node``, ``MDB_meta`` and ``MDB_db`` in liblmdb's ``mdb.c``.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardstream.errors import InputError

NODESIZE = 8  # lo u16, hi u16, flags u16, ksize u16; then the key, then the value
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
P_DIRTY, P_LEAF2, P_SUBP, P_LOOSE, P_KEEP = 0x10, 0x20, 0x40, 0x4000, 0x8000
P_KNOWN = 0x7F | P_LOOSE | P_KEEP
P_MEMORY = P_DIRTY | P_LOOSE | P_KEEP  # in-memory marks (0.9 leaves P_DIRTY on sub-pages)
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MDB_DUPSORT, MDB_DUPFIXED = 0x04, 0x10
PERSISTENT_FLAGS = 0x7E  # REVERSEKEY DUPSORT INTEGERKEY DUPFIXED INTEGERDUP REVERSEDUP
P_INVALID = (1 << 64) - 1
CURSOR_STACK = 32  # liblmdb's deepest tree
MAGIC = 0xBEEFC0DE
Array = np.ndarray[Any, Any]
CHUNK_PAGES = 4096  # pages of one level handled at once: bounds the index arrays

_DB = struct.Struct("<IHHQQQQQ")  # MDB_db: pad, flags, depth, branch, leaf, overflow, entries, root
_META = struct.Struct("<IIQQ")  # magic, version, address, map size; then the two MDB_db
_META_TAIL = struct.Struct("<QQ")  # mm_last_pg, mm_txnid


@dataclass(frozen=True)
class Layout:
    """Where an LMDB version keeps a page's fields."""

    name: str
    header: int  # PAGEHDRSZ: pad, flags, lower/upper (or the overflow run) end it
    base: int  # PAGEBASE: node offsets and free-space bounds count from here
    version: int  # MDB_DATA_VERSION


LAYOUTS = (Layout("0.9", 16, 0, 1), Layout("1.0", 24, 24, 3))


@dataclass(frozen=True)
class Db:
    """An ``MDB_db`` record: a B-tree's flags, shape and counts."""

    pad: int  # the free DB's: the page size; a DUPFIXED sub-database's: the key size
    flags: int
    depth: int
    branch: int
    leaf: int
    overflow: int
    entries: int
    root: int


@dataclass(frozen=True)
class Meta:
    page: int  # 0 or 1
    layout: Layout
    psize: int
    main: Db
    last: int  # the last page number in use
    txnid: int


def data_file(path: str) -> str:
    """The database's data file: ``data.mdb`` in an LMDB folder, or the file itself."""
    return os.path.join(path, "data.mdb") if os.path.isdir(path) else path


def _read_meta(fd: int, page: int, offset: int) -> Meta | str:
    """Meta page ``page`` at ``offset``, or what is wrong with it."""
    raw = os.pread(fd, 64 + _META.size + 2 * _DB.size + _META_TAIL.size, offset)
    layout = next(
        (k for k in LAYOUTS if raw[k.header : k.header + 4] == MAGIC.to_bytes(4, "little")), None
    )
    if layout is None:
        return "no LMDB magic number (not LMDB, or a 32-bit or big-endian LMDB file)"
    at = layout.header
    if len(raw) < at + _META.size + 2 * _DB.size + _META_TAIL.size:
        return "cut short"
    pgno = int.from_bytes(raw[:8], "little")
    flags = int.from_bytes(raw[at - 6 : at - 4], "little")
    _, version, _, _ = _META.unpack_from(raw, at)
    free = Db(*_DB.unpack_from(raw, at + _META.size))
    main = Db(*_DB.unpack_from(raw, at + _META.size + _DB.size))
    last, txnid = _META_TAIL.unpack_from(raw, at + _META.size + 2 * _DB.size)
    psize = free.pad  # LMDB keeps the page size in the free DB's md_pad
    if pgno != page or flags != P_META:
        return f"its header is not meta page {page}'s"
    if version != layout.version:
        return f"data version {version}, not LMDB {layout.name}'s {layout.version}"
    if not 512 <= psize <= 65536 or psize & (psize - 1):
        return f"page size {psize} is not LMDB's"
    return Meta(page, layout, psize, main, last, txnid)


def newest_meta(path: str) -> tuple[Meta, int]:
    """The meta page LMDB reads (the one with the higher transaction id; page 0 on a tie)
    and the file's size; a meta page that is not LMDB's is an error naming it."""
    data = data_file(path)
    try:
        with open(data, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if not size:
                raise InputError(f"{data}: empty file, not an LMDB database")
            first = _read_meta(f.fileno(), 0, 0)
            second = _read_meta(f.fileno(), 1, first.psize) if isinstance(first, Meta) else None
    except OSError as exc:
        raise InputError(f"{data}: cannot read the LMDB database ({exc.strerror})") from exc
    for page, meta in ((0, first), (1, second)):
        if isinstance(meta, str):
            raise InputError(
                f"{data}: not an LMDB database, or a damaged one: page {page} is not an LMDB "
                f"meta page ({meta})"
            )
    assert isinstance(first, Meta) and isinstance(second, Meta)
    if second.psize != first.psize or second.layout != first.layout:
        _fail(data, 1, "its page size or layout differs from meta page 0's")
    return (second if second.txnid > first.txnid else first), size


def check_size(path: str) -> None:
    """Refuse a database file shorter than its newest meta page says it is: the cheap part
    of :func:`check`, for the readers of a file :func:`check` has passed."""
    meta, size = newest_meta(path)
    _check_length(data_file(path), meta, size)


def _check_length(data: str, meta: Meta, size: int) -> None:
    need = (meta.last + 1) * meta.psize
    if size < need:
        raise InputError(
            f"{data}: truncated LMDB database: {size} bytes, but its meta page needs {need} "
            f"({meta.last + 1} pages of {meta.psize} bytes); the file was cut short (copy it again)"
        )


def check(path: str) -> None:
    """Refuse a database liblmdb could not read without reading outside its file (see the
    module's docstring): one :class:`InputError` naming the file and the page."""
    data = data_file(path)
    meta, size = newest_meta(path)
    if meta.last < 1:
        _fail(data, meta.page, f"the last page in use, {meta.last}, is a meta page")
    _check_length(data, meta, size)
    main = meta.main
    if main.flags & ~PERSISTENT_FLAGS:
        _fail(data, meta.page, f"the main database's flags {main.flags:#x} are not LMDB's")
    if main.root == P_INVALID:
        if main.depth or main.entries or main.branch or main.leaf or main.overflow:
            _fail(data, meta.page, "an empty main database with a depth, entries or pages")
        return
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        walk = _Walk(data, mm, meta)
        try:
            walk.tree(main, meta.page, "the main database")
        finally:
            walk.release()


def _fail(data: str, page: int, what: str) -> None:
    raise InputError(
        f"{data}: damaged LMDB database: page {page}: {what} (the file is garbled or was "
        "changed while it was read: copy or restore it again)"
    )


class _Walk:
    """One walk over a database's pages through a read-only map of the file. Every offset
    it reads is checked first to lie in a page below ``limit``: the pages in use, which
    :func:`_check_length` has found in the file."""

    def __init__(self, data: str, mm: mmap.mmap, meta: Meta) -> None:
        self.data, self.psize = data, meta.psize
        self.header, self.base = meta.layout.header, meta.layout.base
        self.limit = meta.last + 1  # liblmdb refuses pages past the last one in use
        size = len(mm)
        # Unaligned little-endian views at every byte offset: fields gathered by numpy.
        self.u8 = np.frombuffer(mm, np.uint8)
        self.u16: Array = np.ndarray((size - 1,), "<u2", mm, 0, (1,))
        self.u64: Array = np.ndarray((size - 7,), "<u8", mm, 0, (1,))
        self.seen = np.zeros(self.limit, np.bool_)
        self.seen[:2] = True  # the meta pages

    def release(self) -> None:
        """Drop the views, so that the map can close."""
        del self.u8, self.u16, self.u64

    def _where(self, ok: Array | bool, pages: Array, what: str) -> None:
        """Fail on the lowest page where ``ok`` is false; ``pages`` names each element's
        page."""
        if not np.all(ok):
            _fail(self.data, int(np.asarray(pages)[~np.asarray(ok)].min()), what)

    def _claim(self, pages: Array, parents: Array, what: str) -> None:
        """``pages``, named by pages ``parents``, are in use and named for the first time."""
        self._where((pages >= 2) & (pages < self.limit), parents, f"{what} outside the database")
        self._where(~self.seen[pages], parents, f"{what} named twice (a cycle)")
        order = np.argsort(pages, kind="stable")
        twice = np.zeros(pages.size, np.bool_)
        twice[order[1:]] = pages[order[1:]] == pages[order[:-1]]
        self._where(~twice, parents, f"{what} named twice")
        self.seen[pages] = True

    def tree(self, db: Db, page: int, what: str, dups: bool = False) -> int:
        """Walk the B-tree of ``db`` (recorded on ``page``) level by level and check its
        counts; returns its entries. ``dups``: a sub-database of sorted duplicates (keys
        alone; LEAF2 pages when ``MDB_DUPFIXED``)."""
        if not 1 <= db.depth <= CURSOR_STACK:
            _fail(self.data, page, f"{what}'s depth {db.depth} is not LMDB's")
        level = np.array([db.root], np.uint64).astype(np.int64)  # P_INVALID: -1, outside
        self._claim(level, np.array([page]), f"{what}'s root page is")
        found = {"branch": 0, "leaf": 0, "overflow": 0, "entries": 0}
        self.sub_pages = {"branch": 0, "leaf": 0, "overflow": 0}  # of sub-databases below
        for depth in range(1, db.depth + 1):
            leaves = depth == db.depth
            children, parents = [], []
            for start in range(0, level.size, CHUNK_PAGES):
                pages = level[start : start + CHUNK_PAGES]
                if leaves:
                    overflow, entries = self._leaves(pages, db, dups)
                    found["overflow"] += overflow
                    found["entries"] += entries
                else:
                    child, parent = self._branches(pages)
                    children.append(child)
                    parents.append(parent)
            found["leaf" if leaves else "branch"] += level.size
            if not leaves:
                level = np.concatenate(children)
                self._claim(level, np.concatenate(parents), "a child page is")
        recorded = {"branch": db.branch, "leaf": db.leaf, "overflow": db.overflow}
        subs, self.sub_pages = self.sub_pages, {}
        for key, value in {**recorded, "entries": db.entries}.items():
            # A DUPSORT database's page counts include its sub-databases' in some LMDB
            # versions, not in others: either is LMDB's.
            if value != found[key] and value != found[key] + subs.get(key, -1):
                noun = "entries" if key == "entries" else f"{key} pages"
                _fail(self.data, page, f"{what} records {value} {noun}, its tree has {found[key]}")
        return found["entries"]

    def _headers(self, pages: Array, want: int, what: str) -> tuple[Array, ...]:
        """The pages' offsets and free-space bounds, with their page numbers and flags
        checked (``want``: the flags a page of this place has)."""
        at, h = pages * self.psize, self.header
        self._where(self.u64[at] == pages.astype(np.uint64), pages, "its header names another page")
        flags = self.u16[at + h - 6].astype(np.int64)
        self._where((flags & ~P_KNOWN) == 0, pages, "its header's flags are not LMDB's")
        self._where(flags & ~P_MEMORY == want, pages, f"not {what} (its flags, or its level)")
        lower = self.u16[at + h - 4].astype(np.int64)
        upper = self.u16[at + h - 2].astype(np.int64)
        floor = h - self.base
        fits = (lower >= floor) & (lower <= upper) & (upper <= self.psize - self.base)
        self._where(fits & ((lower - floor) % 2 == 0), pages, "its free-space bounds are wrong")
        nkeys = (lower - floor) >> 1
        self._where(nkeys > 0, pages, f"{what} without keys")
        return at, upper, nkeys

    def _nodes(self, pages: Array, at: Array, upper: Array, nkeys: Array) -> tuple[Array, ...]:
        """The pages' nodes: each one's page, offset in the file and end of its key (from
        the node's start), and its ``lo | hi << 16``, flags."""
        owner = np.repeat(np.arange(pages.size), nkeys)
        slot = np.arange(owner.size) - np.repeat(np.cumsum(nkeys) - nkeys, nkeys)
        node_at = at[owner]
        ptr = self.u16[node_at + self.header + 2 * slot].astype(np.int64) + self.base
        node_pages = pages[owner]
        inside = (ptr >= upper[owner] + self.base) & (ptr + NODESIZE <= self.psize)
        self._where(inside, node_pages, "a node pointer outside the page's nodes")
        node_at += ptr
        head = self.u64[node_at]  # lo, hi, flags, ksize: 16 bits each
        key_end = ptr + NODESIZE + (head >> 48).astype(np.int64)
        return node_pages, node_at, key_end, (head & 0xFFFFFFFF).astype(np.int64), head

    def _branches(self, pages: Array) -> tuple[Array, Array]:
        """Check branch pages; returns their children and the page naming each."""
        at, upper, nkeys = self._headers(pages, P_BRANCH, "a branch page")
        node_pages, _, key_end, _, head = self._nodes(pages, at, upper, nkeys)
        self._where(key_end <= self.psize, node_pages, "a key runs past its page")
        return (head & 0xFFFF_FFFF_FFFF).astype(np.int64), node_pages  # lo | hi | flags: pgno

    def _leaves(self, pages: Array, db: Db, dups: bool) -> tuple[int, int]:
        """Check leaf pages; returns the overflow pages and entries they hold."""
        leaf2 = dups and bool(db.flags & MDB_DUPFIXED)
        want = P_LEAF | P_LEAF2 if leaf2 else P_LEAF
        at, upper, nkeys = self._headers(pages, want, "a leaf page")
        if leaf2:  # keys of md_pad bytes each, packed after the header
            fits = self.header + nkeys * db.pad <= self.psize
            self._where(fits, pages, "its keys overrun the page")
            return 0, int(nkeys.sum())
        node_pages, node_at, key_end, dsize, head = self._nodes(pages, at, upper, nkeys)
        nflags = ((head >> 32) & 0xFFFF).astype(np.int64)
        big = nflags == F_BIGDATA
        if dups:  # a duplicate is a key alone
            allowed = (nflags == 0) & (dsize == 0)
        else:
            allowed = (nflags == 0) | big | (nflags == F_SUBDATA)
            if db.flags & MDB_DUPSORT:
                allowed |= (nflags == F_DUPDATA) | (nflags == F_DUPDATA | F_SUBDATA)
        self._where(allowed, node_pages, "a node's flags are not LMDB's")
        end = key_end + np.where(big, 8, dsize)
        self._where(end <= self.psize, node_pages, "a node runs past its page")
        data_at = node_at - (node_at % self.psize) + key_end  # the value's offset in the file
        overflow, entries = 0, int(node_pages.size)
        if big.any():
            first = self.u64[data_at[big]].astype(np.int64)  # past 2**63 wraps: outside
            overflow = self._overflow(first, dsize[big], node_pages[big])
        dup = (nflags & F_DUPDATA) != 0
        if dup.any():
            entries -= int(dup.sum())
            for value_at, length, flags, page in zip(
                data_at[dup].tolist(),
                dsize[dup].tolist(),
                nflags[dup].tolist(),
                node_pages[dup].tolist(),
                strict=True,
            ):
                entries += self._dups(value_at, length, bool(flags & F_SUBDATA), db, page)
        return overflow, entries

    def _overflow(self, first: Array, dsize: Array, parents: Array) -> int:
        """Check values on overflow pages (first pages ``first``, sizes ``dsize``, named by
        leaf pages ``parents``); returns the pages their runs take."""
        inside = (first >= 2) & (first < self.limit)
        self._where(inside, parents, "a value's overflow page is outside the database")
        order = np.argsort(first)  # the headers in file order: the kernel reads ahead
        first, dsize, parents = first[order], dsize[order], parents[order]
        self._where(~self.seen[first], parents, "a value's overflow page is a tree page")
        at, h = first * self.psize, self.header
        self._where(self.u64[at] == first.astype(np.uint64), first, "its header names another page")
        flags = self.u16[at + h - 6].astype(np.int64)
        self._where(flags & ~P_MEMORY == P_OVERFLOW, first, "not an overflow page (its flags)")
        run = self.u16[at + h - 4].astype(np.int64) | self.u16[at + h - 2].astype(np.int64) << 16
        need = (h - 1 + dsize) // self.psize + 1  # OVPAGES
        # A run can be longer than its value: LMDB overwrites a value in place with a
        # smaller one where the old run holds it.
        self._where(run >= need, first, "its run of overflow pages is shorter than its value")
        inside = first + run <= self.limit
        self._where(inside, first, "its run of overflow pages goes past the database")
        return int(run.sum())

    def _dups(self, at: int, length: int, sub: bool, db: Db, page: int) -> int:
        """A key's sorted duplicates: ``length`` bytes at ``at`` on leaf page ``page``, an
        inline sub-page or (``sub``) a sub-database record; returns the duplicates."""
        if sub:
            if length != _DB.size:
                _fail(self.data, page, "a sub-database record of the wrong size")
            record = Db(*_DB.unpack_from(self.u8[at : at + length].tobytes()))
            if record.flags & ~PERSISTENT_FLAGS:
                _fail(self.data, page, "a sub-database's flags are not LMDB's")
            above = self.sub_pages
            entries = self.tree(record, page, "a sub-database", dups=True)
            self.sub_pages = above
            for key, pages in (("branch", record.branch), ("leaf", record.leaf)):
                above[key] += pages
            return entries
        h, base = self.header, self.base
        if length < h:
            _fail(self.data, page, "a sub-page smaller than its header")
        raw = self.u8[at : at + h].tobytes()
        pad, flags, lower, upper = struct.unpack_from("<HHHH", raw, h - 8)
        kind = flags & ~P_MEMORY
        floor = h - base
        if kind not in (P_LEAF | P_SUBP, P_LEAF | P_LEAF2 | P_SUBP):
            _fail(self.data, page, "a sub-page's flags are not LMDB's")
        if not floor <= lower <= upper <= length - base or (lower - floor) % 2:
            _fail(self.data, page, "a sub-page's free-space bounds do not fit it")
        nkeys = int(lower - floor) >> 1
        if kind & P_LEAF2:
            if h + nkeys * pad > length:
                _fail(self.data, page, "a sub-page's keys overrun it")
            return nkeys
        for i in range(nkeys):
            ptr = int(self.u16[at + h + 2 * i]) + base
            if ptr < upper + base or ptr + NODESIZE > length:
                _fail(self.data, page, "a sub-page's node pointer is outside it")
            if ptr + NODESIZE + int(self.u16[at + ptr + 6]) > length:
                _fail(self.data, page, "a sub-page's key runs past it")
        return nkeys
