# driver.py - runs one task of runtime python-data-analysis-v1.
#
# The worker runs `python3 -I -B -c <this file>` inside the sandbox with:
#   stdin  the user's code (UTF-8), read whole; then stdin is /dev/null
#   fd 3   the report channel back to the worker (see below)
#   cwd    the workspace (/workspace in the sandbox), holding the inputs
# The code runs as the script "main.py" in a fresh __main__ module. After it
# ends, every matplotlib figure still open is saved as figure-N.png. The exit
# status is the code's: 0, the SystemExit code, or 1 for an exception.
#
# The report is NUL-terminated key/value strings: kind ("exception" or
# "memory"), error, hint, peak_kb, and for a session step (below)
# session_restored ("1"), session_restore_error, session_dropped ("name
# (reason)" lines), session_state_error and session_files ("<sha256> <path>"
# lines: the files restored from the state), session_keep_previous ("1":
# the state could not be loaded for want of memory or room, so what this
# step leaves must not replace it). The restore's keys are reported once
# before the code runs, and again at the end. The code can write there too:
# that only changes the result of its own step.
#
# Sessions (docs/contract.md section 16): when the worker put `.ci-session`
# ("max_state_bytes=N") in the workspace, and `.ci-state` (the archive the
# previous step left), the driver restores the globals and files before the
# code runs, and after it saves them into `.ci-state-out`. Inputs never
# start with '.', so only the worker can have put those names there.
#
# Rich outputs (docs/contract.md section 17): the value of the code's last
# statement, when it is a bare expression whose value is not None, and each
# call of the builtin display(obj) are rendered (text/plain; a DataFrame or
# Series also as text/html and application/json; a matplotlib Figure also as
# image/png) when they are made and written at the end to `.ci-outputs`
# (JSON), which the worker reads, checks and copies into the result.
#
# Nothing heavy is imported here: pandas and matplotlib cost ~0.5 s, and only
# the code decides whether it needs them (MPLBACKEND=Agg is in the env).
#
# Randomness: each task is a fresh process, so `random`, hash() and numpy's
# legacy global RandomState are already seeded from the OS.
#
# Warm mode (local.mode: warm): the same file is loaded once into a zygote
# (src/zygote/main.c) as the module `ci_driver`, which calls _warm_prepare() to
# import the runtime, then forks one child per task; each child calls
# _warm_main() in a fresh sandbox with the same fds, cwd and environment as
# above. The child is forked ahead of its task and runs _warm_up() (our
# fixed code) before the task's code and fds reach it. Then it reseeds
# `random` and numpy (hash() is randomized per zygote, which is replaced
# every local.warm_rotate_after tasks) and ends the way Python's own exit
# would, without tearing the interpreter down.

import sys
import os

_SHIPPED = ("numpy", "pandas", "matplotlib", "openpyxl")
_ALIASES = {
    "pd": ("pandas", "import pandas as pd"),
    "np": ("numpy", "import numpy as np"),
    "plt": ("matplotlib.pyplot", "import matplotlib.pyplot as plt"),
    "mpl": ("matplotlib", "import matplotlib as mpl"),
}
_MAX_TEXT = 300
_MAX_FIGURES = 100


def _first_line(text):
    text = str(text).strip().split("\n", 1)[0]
    if len(text) > _MAX_TEXT:
        text = text[: _MAX_TEXT - 3] + "..."
    return text


def _describe(exc):
    name = type(exc).__name__
    try:
        msg = _first_line(exc) if str(exc) else ""
    except Exception:  # an exception whose __str__ fails
        msg = ""
    return name + ": " + msg if msg else name


def _peak_kb():
    """Peak resident memory of this process since python3 started, in KiB.

    getrusage() would also count what the worker had mapped before execve.
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _workspace_listing():
    try:
        names = sorted(os.listdir("."))
    except OSError:
        return None
    shown = [n + ("/" if os.path.isdir(n) else "") for n in names[:20]]
    if len(names) > 20:
        shown.append("... (%d more)" % (len(names) - 20))
    return shown


def _shipped_versions():
    """"numpy 1.24.2, pandas 1.5.3, ...": the shipped packages this Python
    has, with the versions their metadata gives (cheap: nothing heavy is
    imported). One whose metadata is missing is named without a version."""
    try:
        import importlib.metadata as md
        import importlib.util
    except Exception:
        return ", ".join(_SHIPPED)
    shown = []
    for name in _SHIPPED:
        try:
            shown.append("%s %s" % (name, md.version(name)))
        except Exception:
            try:
                if importlib.util.find_spec(name) is not None:
                    shown.append(name)
            except Exception:
                pass
    return ", ".join(shown) if shown else "no third-party package"


def _hint(exc, dropped=None):
    """What to try next for the agent, or None. dropped: the names a
    session's earlier step could not keep, with why."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".", 1)[0]
        if top not in _SHIPPED and top not in sys.stdlib_module_names:
            return ("'%s' is not available in this runtime and packages cannot be installed "
                    "(no pip, no network); available: %s and the Python %d.%d standard library"
                    % (top, _shipped_versions(), sys.version_info[0], sys.version_info[1]))
        return None
    if isinstance(exc, NameError) and getattr(exc, "name", None):
        name = exc.name
        if dropped and name in dropped:
            return ("'%s' was not kept from the session's previous step (%s): create it again "
                    "in this step" % (name, dropped[name]))
        if name in _ALIASES:
            module, stmt = _ALIASES[name]
            return "%s is imported as %s: add `%s`" % (module, name, stmt)
        if name in _SHIPPED or name in sys.stdlib_module_names:
            return "add `import %s`" % name
        return None
    if isinstance(exc, FileNotFoundError):
        listing = _workspace_listing()
        if listing is None:
            return None
        if not listing:
            return ("the working directory %s is empty: no input files were sent with the task"
                    % os.getcwd())
        return "the files in %s are: %s" % (os.getcwd(), ", ".join(listing))
    if isinstance(exc, OSError):
        import errno
        if exc.errno == errno.EFBIG:
            return "a file grew past the size limit of the workspace; write less data"
        if exc.errno == errno.ENOSPC:
            return ("the workspace or /tmp is full; write less data or delete files you no "
                    "longer need")
        if exc.errno in (errno.ENETUNREACH, errno.ECONNREFUSED, errno.EHOSTUNREACH):
            return "there is no network access in this sandbox; send the data as input files"
    module = type(exc).__module__ or ""
    if module.startswith(("socket", "urllib", "http", "ssl")):
        return "there is no network access in this sandbox; send the data as input files"
    return None


# Sessions: the workspace names only the worker and the driver use. The
# worker writes the first two, the driver the last two; none is ever an
# artifact or part of a state.
_SESSION_FILE = ".ci-session"
_STATE_IN = ".ci-state"
_STATE_OUT = ".ci-state-out"
_STATE_TMP = ".ci-state-out.tmp"
_OUTPUTS = ".ci-outputs"
_OUTPUTS_TMP = ".ci-outputs.tmp"
_RESERVED = (_SESSION_FILE, _STATE_IN, _STATE_OUT, _STATE_TMP, _OUTPUTS, _OUTPUTS_TMP)
_STATE_MAGIC = b"ci-session-state 1\n"
_STATE_MAX_FILES = 10000    # files a state may carry
_STATE_MAX_DEPTH = 32       # directory levels walked
_REPORT_FILES = 2000        # restored files named in the report
_REPORT_FILES_BYTES = 200 * 1024
_REPORT_DROPPED_BYTES = 8000


def _size_text(n):
    if n >= 1 << 20:
        return "%.1f MiB" % (n / (1 << 20))
    return "%.1f KiB" % (n / 1024)


def _cap_text(n):
    return "%d MiB" % (n >> 20) if n % (1 << 20) == 0 else "%d bytes" % n


def _uncarriable(value):
    """Why value cannot go into the next step (a reason as the result names
    it), or None. Some of these dill would pickle, uselessly: a file handle
    would be reopened at its path, a thread would be a new unstarted one."""
    import io
    import types
    if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
        return "open file"
    socket = sys.modules.get("socket")
    if socket is not None and isinstance(value, socket.socket):
        return "socket"
    if isinstance(value, types.GeneratorType):
        return "generator"
    if isinstance(value, (types.CoroutineType, types.AsyncGeneratorType)):
        return "coroutine"
    threading = sys.modules.get("threading")
    if threading is not None and isinstance(value, threading.Thread):
        return "thread"
    artist = getattr(sys.modules.get("matplotlib.artist"), "Artist", None)
    if artist is not None and isinstance(value, artist):
        return "figure"  # saved as figure-N.png when left open, not carried
    if isinstance(getattr(value, "__self__", None), _Outputs) or isinstance(value, _Outputs):
        return "the runtime's display(): it is there in every step"
    return None


def _safe_rel(path):
    """Is path (from an archive) a relative path inside the workspace that
    is not one of the reserved names?"""
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        return False
    parts = path.split("/")
    return all(p not in ("", ".", "..") for p in parts) and parts[0] not in _RESERVED


def _remove(path):
    try:
        os.unlink(path)
    except IsADirectoryError:
        import shutil
        shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def _read_fd(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _read_regular(path):
    """The bytes of the regular file at path, following no symlink; None for
    anything else."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return _read_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


# The restore's keys, reported before the code runs.
_SESSION_EARLY_KEYS = ("session_restored", "session_restore_error", "session_files",
                       "session_keep_previous")


class _NotPlain(Exception):
    pass


def _state_pickler(main):
    """dill's pickler (our per-task __main__ as its _main), with one shortcut:
    dill's is pure Python, ~100x slower than the C one on a DataFrame's
    object columns, so a numpy or pandas object whose contents the C
    pickler can take whole (no function, module or class of the code, no
    instance of one) is written as pickle.loads(<its C pickle>). It stays
    one object of the one dump: references to it are shared."""
    import io
    import pickle
    import types
    import dill

    class Plain(pickle.Pickler):
        def reducer_override(self, obj):
            # By reference, C pickle would name them in a __main__ that does
            # not hold them yet when the state is read; dill makes them.
            if type(obj).__module__ == "__main__":
                raise _NotPlain()
            if isinstance(obj, (type, types.FunctionType)) and (
                    obj.__module__ == "__main__" or "<" in obj.__qualname__):
                raise _NotPlain()
            return NotImplemented

    class StatePickler(dill.Pickler):
        def save(self, obj, save_persistent_id=True):
            mod = type(obj).__module__
            if ((mod == "numpy" or mod.startswith(("numpy.", "pandas."))) and
                    id(obj) not in self.memo):
                buf = io.BytesIO()
                try:
                    Plain(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
                except Exception:
                    buf = None
                if buf is not None:
                    self.save_reduce(pickle.loads, (buf.getvalue(),), obj=obj)
                    return
            dill.Pickler.save(self, obj, save_persistent_id)

    buf = io.BytesIO()
    pickler = StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler._main = main
    return pickler, buf


# Rich outputs: the caps of docs/contract.md section 17 (the worker checks
# them again; these keep the driver from making what it would refuse).
_OUT_MAX = 20                    # outputs per task
_OUT_TOTAL = 2 << 20             # bytes of data in all
_OUT_TEXT = 64 * 1024            # text/plain
_OUT_TABLE = 256 * 1024          # text/html and application/json, each
_OUT_PNG = 256 * 1024            # a PNG inlined (before base64)
_OUT_ROWS = 100                  # rows of a table shown


def _clean_text(text):
    """Text that is valid UTF-8 without NUL (the worker refuses either)."""
    text = text.replace("\0", "\ufffd")
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _cut_utf8(text, cap):
    """(text within cap bytes of UTF-8, cut on a character boundary, was_cut)."""
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text, False
    return data[:cap].decode("utf-8", "ignore"), True


def _bounded_repr(value):
    """repr() that does not build megabytes to keep 64 KiB: long strings and
    bytes are cut first, long builtin containers shown in part."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > _OUT_TEXT:
        return repr(value[:_OUT_TEXT]) + "..."
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > 1000:
        import reprlib
        r = reprlib.Repr()
        r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 1000
        r.maxdict = 1000
        r.maxstring = r.maxother = 1000
        r.maxlevel = 8
        return r.repr(value)
    return repr(value)


class _Outputs:
    """The outputs of one task, rendered as they are made."""

    def __init__(self, ws):
        self.ws = ws            # the workspace: the code may chdir away
        self.items = []
        self.size = 0           # bytes of data kept
        self.truncated = False  # some were left out
        self.png_n = 1          # the next output-N.png to try

    def add(self, kind, value):
        """Renders value as an output; never raises (but BaseExceptions such
        as a KeyboardInterrupt or a MemoryError go through)."""
        if self.truncated:
            return
        if len(self.items) >= _OUT_MAX:
            self.truncated = True
            return
        out = {"kind": kind, "data": {}, "truncated": False, "total_rows": 0, "artifact": ""}
        try:
            self._render(value, out)
        except Exception as e:
            if not out["data"].get("text/plain"):
                out["data"]["text/plain"] = "<%s: could not be shown: %s>" % (
                    _type_name(value), _describe(e)[:200])
        data = out["data"]
        for key in list(data):
            data[key] = _clean_text(data[key])
        size = sum(len(v.encode("utf-8")) for v in data.values())
        if self.size + size > _OUT_TOTAL:
            self.truncated = True
            return
        self.size += size
        self.items.append(out)

    def _render(self, value, out):
        data = out["data"]
        try:
            text = _bounded_repr(value)
            if not isinstance(text, str):
                raise TypeError("__repr__ returned %s" % type(text).__name__)
        except Exception as e:
            text = "<%s: repr() failed: %s>" % (_type_name(value), _describe(e)[:200])
        text, cut = _cut_utf8(_clean_text(text), _OUT_TEXT)
        data["text/plain"] = text
        out["truncated"] = cut
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(value, (pd.DataFrame, pd.Series)):
            self._table(value, out)
            return
        figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure is not None and isinstance(value, figure):
            self._figure(value, out)

    def _table(self, value, out):
        """text/html and application/json of the first rows; fewer rows when
        they would not fit their cap; a key is left out when even one row
        would not."""
        frame = value.to_frame() if hasattr(value, "to_frame") else value
        total = len(frame)
        out["total_rows"] = total
        for key, make in (("text/html", lambda f: f.to_html()),
                          ("application/json",
                           lambda f: f.to_json(orient="records", date_format="iso"))):
            rows = min(total, _OUT_ROWS)
            text = None
            try:
                while True:
                    text = make(frame.head(rows))
                    if len(text.encode("utf-8", "replace")) <= _OUT_TABLE:
                        break
                    text = None
                    if rows <= 1:
                        break
                    rows //= 2
            except Exception:
                text = None
            if text is None:
                out["truncated"] = True
                continue
            out["data"][key] = text
            if rows < total:
                out["truncated"] = True

    def _figure(self, fig, out):
        """image/png inline, or output-N.png in the workspace when larger;
        then the figure is closed: it is not saved again as figure-N.png."""
        import base64
        import io
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png")
        finally:
            plt = sys.modules.get("matplotlib.pyplot")
            if plt is not None:
                try:
                    plt.close(fig)
                except Exception:
                    pass
        png = buf.getvalue()
        if len(png) <= _OUT_PNG:
            out["data"]["image/png"] = base64.b64encode(png).decode("ascii")
            return
        while True:
            name = "output-%d.png" % self.png_n
            self.png_n += 1
            try:
                fd = os.open(os.path.join(self.ws, name),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o644)
            except FileExistsError:
                continue
            break
        with open(fd, "wb") as f:
            f.write(png)
        out["artifact"] = name

    def display(self, *objs, **kwargs):
        """display(obj, ...): each object becomes an output, in order."""
        for obj in objs:
            self.add("display", obj)

    def write(self):
        """Writes .ci-outputs (a temporary name, then a rename); removes one
        the code may have left when there is nothing to say."""
        import json
        for name in (_OUTPUTS, _OUTPUTS_TMP):
            _remove(os.path.join(self.ws, name))
        if not self.items and not self.truncated:
            return
        blob = json.dumps({"outputs": self.items, "truncated": self.truncated},
                          ensure_ascii=False).encode("utf-8")
        tmp = os.path.join(self.ws, _OUTPUTS_TMP)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                f.write(blob)
            os.rename(tmp, os.path.join(self.ws, _OUTPUTS))
        except OSError as e:
            _remove(tmp)
            sys.stderr.write("could not write the outputs: %s\n" % _describe(e))


def _type_name(value):
    try:
        return type(value).__name__
    except Exception:
        return "object"


class _Session:
    """A session step's state: restored before the code, saved after it."""

    def __init__(self, ws, max_bytes, archive, fields):
        self.ws = ws                # the workspace: the code may chdir away
        self.max_bytes = max_bytes
        self.archive = archive      # bytes of .ci-state, or None (a new session)
        self.fields = fields        # the driver's report
        self.dropped = {}           # name -> reason, carried from step to step

    @classmethod
    def open(cls, fields):
        """The session of this task, or None when it is no session step. Takes
        the worker's files out of the code's way."""
        ws = os.getcwd()
        text = _read_regular(os.path.join(ws, _SESSION_FILE))
        if text is None:
            return None
        _remove(os.path.join(ws, _SESSION_FILE))
        max_bytes = 64 << 20
        for line in text.decode("ascii", "replace").splitlines():
            key, _, value = line.partition("=")
            if key == "max_state_bytes" and value.isdigit():
                max_bytes = int(value)
        archive = _read_regular(os.path.join(ws, _STATE_IN))
        _remove(os.path.join(ws, _STATE_IN))
        return cls(ws, max_bytes, archive, fields)

    def restore(self, main):
        """Files first (a module the code wrote and imported is imported again
        when the globals load), then the globals into main's dict. Functions
        the code defined get main's dict as their globals: dill writes the
        dict it was told is __main__'s as a reference, and reads that
        reference as the dict it is told is __main__'s."""
        data, self.archive = self.archive, None
        if data is None:
            return
        import io
        import pickle
        try:
            if not data.startswith(_STATE_MAGIC):
                raise ValueError("it is not a state archive")
            box = pickle.loads(memoryview(data)[len(_STATE_MAGIC):])
            del data
            if not isinstance(box, dict) or not isinstance(box.get("files"), list):
                raise ValueError("it is not a state archive")
            files = box["files"]
            blob = box.get("globals", b"")
            dropped = box.get("dropped") or {}
        except Exception as e:
            if isinstance(e, MemoryError):
                self.fields["session_keep_previous"] = "1"
            self.fields["session_restore_error"] = (
                "the state could not be restored (%s); this step ran without it" % _describe(e))
            return
        self.dropped = {k: str(v) for k, v in dropped.items() if isinstance(k, str)}
        self._restore_files(files)
        try:
            import dill
            unpickler = dill.Unpickler(io.BytesIO(blob))
            unpickler._main = main
            values = unpickler.load()
            if not isinstance(values, dict):
                raise ValueError("it holds no variables")
        except Exception as e:
            if isinstance(e, MemoryError):
                # Not the state's fault: the step's memory limit. What this
                # step leaves must not replace it.
                self.fields["session_keep_previous"] = "1"
            self.fields["session_restore_error"] = (
                "the variables could not be restored (%s); this step ran without them"
                % _describe(e))
            return
        main.__dict__.update((k, v) for k, v in values.items() if isinstance(k, str))
        # A restored figure must not be saved again as this step's figure.
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            try:
                plt.close("all")
            except Exception:
                pass
        self.fields["session_restored"] = "1"

    def _restore_files(self, files):
        """Writes each file unless one of that path exists (an input of this
        step wins); reports what it wrote with its sha256, for the artifact
        walk to tell an unchanged restored file from a new one."""
        import errno
        import hashlib
        lines, size, failed = [], 0, []
        for item in files[:_STATE_MAX_FILES]:
            if not isinstance(item, tuple) or len(item) != 2:
                continue
            rel, blob = item
            if not _safe_rel(rel) or not isinstance(blob, bytes):
                continue
            path = os.path.join(self.ws, rel)
            if os.path.lexists(path):
                continue
            try:
                if "/" in rel:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                             os.O_CLOEXEC, 0o644)
                try:
                    view = memoryview(blob)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
            except OSError as e:
                failed.append("%s (%s)" % (rel, os.strerror(e.errno) if e.errno else e))
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    self.fields["session_keep_previous"] = "1"
                continue
            line = "%s %s" % (hashlib.sha256(blob).hexdigest(), rel)
            if len(lines) < _REPORT_FILES and size + len(line) + 1 <= _REPORT_FILES_BYTES:
                lines.append(line)
                size += len(line) + 1
        if lines:
            self.fields["session_files"] = "\n".join(lines)
        if failed:
            self.fields["session_restore_error"] = (
                "%d file%s of the state could not be restored: %s" %
                (len(failed), "s" if len(failed) > 1 else "", ", ".join(failed[:5])))

    def _pickle(self, kept, main):
        """kept pickled in one dump (shared objects stay shared); when that
        fails, the names that cannot be pickled are found one by one and
        dropped. Returns (bytes, {name: reason})."""
        def dump(values):
            pickler, buf = _state_pickler(main)
            pickler.dump(values)
            return buf.getvalue()

        try:
            return dump(kept), {}
        except Exception:
            pass
        failed = {}
        for name in list(kept):
            try:
                dump({name: kept[name]})
            except Exception as e:
                failed[name] = "cannot be pickled: " + _first_line(_describe(e))[:100]
                del kept[name]
        try:
            return dump(kept), failed
        except Exception as e:
            # Each alone pickles, together they do not: keep none of them.
            why = "cannot be pickled with the others: " + _first_line(_describe(e))[:100]
            failed.update((name, why) for name in kept)
            return dump({}), failed

    def _walk(self):
        """The regular files of the workspace as (relative path, size), following
        no symlink, without the reserved names; None when there are too many."""
        out = []
        stack = [("", self.ws, 0)]
        while stack:
            prefix, path, depth = stack.pop()
            try:
                entries = sorted(os.scandir(path), key=lambda e: e.name)
            except OSError:
                continue
            for e in entries:
                rel = prefix + e.name
                if not prefix and e.name in _RESERVED:
                    continue
                try:
                    if e.is_dir(follow_symlinks=False):
                        if depth + 1 < _STATE_MAX_DEPTH:
                            stack.append((rel + "/", e.path, depth + 1))
                    elif e.is_file(follow_symlinks=False):
                        out.append((rel, e.stat(follow_symlinks=False).st_size))
                except OSError:
                    continue
                if len(out) > _STATE_MAX_FILES:
                    return None
        return out

    def _over_cap(self, total, sizes):
        """The state error naming the biggest contributors."""
        sizes.sort(key=lambda x: -x[1])
        top = ", ".join("%s (%s)" % (name, _size_text(n)) for name, n in sizes[:5] if n > 0)
        self.fields["session_state_error"] = "the state is %s, over the cap of %s%s%s" % (
            _size_text(total), _cap_text(self.max_bytes), ": " if top else "", top)

    def save(self, main):
        """Writes .ci-state-out (a temporary name, then a rename) or says in
        session_state_error why not. What cannot be carried is dropped and
        named in session_dropped."""
        import pickle
        ws = self.ws
        for name in (_STATE_OUT, _STATE_TMP):
            _remove(os.path.join(ws, name))
        sys.modules["__main__"] = main  # dill finds the code's functions through it
        kept, dropped = {}, {}
        for name, value in list(main.__dict__.items()):
            if not isinstance(name, str) or name.startswith("__"):
                continue
            if isinstance(value, type(sys)) and value.__name__ == "__main__":
                continue
            why = _uncarriable(value)
            if why:
                dropped[name] = why
            else:
                kept[name] = value
        try:
            blob, failed = self._pickle(kept, main)
        except Exception as e:  # MemoryError, RecursionError, ...
            self.fields["session_state_error"] = ("the state could not be made (%s)"
                                                  % _describe(e))
            return
        dropped.update(failed)
        if dropped:
            text, lines = "", []
            for name, why in sorted(dropped.items()):
                line = "%s (%s)" % (name, why)
                if len(text) + len(line) + 1 > _REPORT_DROPPED_BYTES:
                    break
                lines.append(line)
                text += line + "\n"
            self.fields["session_dropped"] = "\n".join(lines)
        carried = {n: r for n, r in self.dropped.items() if n not in kept}
        carried.update(dropped)
        files = self._walk()
        if files is None:
            self.fields["session_state_error"] = (
                "the workspace holds more than %d files; a state keeps at most that many"
                % _STATE_MAX_FILES)
            return
        total = len(_STATE_MAGIC) + len(blob) + sum(n for _, n in files)
        if total > self.max_bytes:
            sizes = [(rel, n) for rel, n in files]
            if len(blob) > self.max_bytes // 20:
                for name in list(kept)[:200]:
                    try:
                        sizes.append((name, len(self._pickle({name: kept[name]}, main)[0])))
                    except Exception:
                        pass
            self._over_cap(total, sizes)
            return
        box = {"globals": blob, "dropped": carried, "files": []}
        for rel, _ in files:
            data = _read_regular(os.path.join(ws, rel))
            if data is not None:
                box["files"].append((rel, data))
        tmp = os.path.join(ws, _STATE_TMP)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            with open(fd, "wb") as f:
                f.write(_STATE_MAGIC)
                pickle.dump(box, f, protocol=pickle.HIGHEST_PROTOCOL)
                size = f.tell()
            if size > self.max_bytes:
                _remove(tmp)
                self._over_cap(size, [(rel, len(d)) for rel, d in box["files"]])
                return
            os.rename(tmp, os.path.join(ws, _STATE_OUT))
        except OSError as e:
            _remove(tmp)
            self.fields["session_state_error"] = "the state could not be written (%s)" % (
                os.strerror(e.errno) if e.errno else _describe(e))


def _compile_cell(text):
    """(code of the statements, code of the last one's expression or None),
    like a notebook cell: the value of a last bare expression is shown. Line
    numbers stay the code's own. Source that does not parse is compiled
    whole, so that its SyntaxError is the one Python gives."""
    import ast
    try:
        tree = ast.parse(text, "main.py")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None  # out of the handler: the error must not chain to this one
    last = tree.body[-1] if tree is not None and tree.body else None
    # Compiled from the text unless there is a last expression to split off
    # (the tree's round trip is deeper in recursion); a lone docstring is one.
    if (not isinstance(last, ast.Expr) or (len(tree.body) == 1 and
            isinstance(last.value, ast.Constant) and isinstance(last.value.value, str))):
        return compile(text, "main.py", "exec"), None
    tree.body.pop()
    try:
        return (compile(tree, "main.py", "exec"),
                compile(ast.Expression(last.value), "main.py", "eval"))
    except (RecursionError, MemoryError):
        pass  # too deep for the tree's round trip: as a script, without the split
    return compile(text, "main.py", "exec"), None


class _Driver:
    def __init__(self):
        self.report = None  # the report fd, kept out of the user's way
        self.fields = {}
        self.session = None  # a _Session for a session step
        self.main = None     # the code's module
        self.outputs = _Outputs(os.getcwd())

    def open_channels(self):
        import fcntl
        try:
            # Move the report channel off fd 3, so that the code's first
            # open() gets 3 as usual; close-on-exec keeps it from children.
            self.report = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 100)
            os.close(3)
        except OSError:
            self.report = None
        code = sys.stdin.buffer.read()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
        # Line-buffered stdout: what was printed before a timeout is kept.
        sys.stdout.reconfigure(line_buffering=True)
        return code

    def send_report(self, only=None, skip=()):
        """Writes the fields (with only: just those keys; never those in
        skip) to the report; a later report's value of a key replaces an
        earlier one's."""
        if only is None:
            peak = _peak_kb()
            if peak is not None:
                self.fields["peak_kb"] = peak
        fields = {k: v for k, v in self.fields.items()
                  if (only is None or k in only) and k not in skip}
        if self.report is None or not fields:
            return
        parts = []
        for key, value in fields.items():
            parts.append(key.encode())
            parts.append(str(value).replace("\0", "").encode("utf-8", "replace"))
        data = b"\0".join(parts) + b"\0"
        try:
            while data:
                data = data[os.write(self.report, data):]
        except OSError:
            pass

    def fail(self, exc):
        self.fields["kind"] = "memory" if isinstance(exc, MemoryError) else "exception"
        if isinstance(exc, MemoryError):
            self.fields["error"] = "the code exceeded the memory limit"
        else:
            self.fields["error"] = _describe(exc)
        hint = None
        try:
            hint = _hint(exc, self.session.dropped if self.session else None)
        except Exception:
            pass
        if hint:
            self.fields["hint"] = hint

    def print_traceback(self, exc):
        import traceback
        tb = exc.__traceback__
        # Drop the driver's own frames: the user sees main.py only.
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        try:
            text = "".join(traceback.format_exception(type(exc), exc, tb))
        except MemoryError:
            text = _describe(exc) + "\n"
        sys.stderr.write(text)

    def run(self, source):
        import builtins
        import linecache
        import types

        main = types.ModuleType("__main__")
        main.__file__ = "main.py"
        main.__builtins__ = builtins
        sys.modules["__main__"] = main
        # multiprocessing aliases __main__ as __mp_main__ when it is imported,
        # and dill binds it (in warm mode the zygote imported both): both must
        # see this one, as they would in a fresh python3.
        if "__mp_main__" in sys.modules:
            sys.modules["__mp_main__"] = main
        for name in ("dill._dill", "dill.session"):
            mod = sys.modules.get(name)
            if mod is not None and hasattr(mod, "_main_module"):
                mod._main_module = main
        self.main = main
        sys.argv = ["main.py"]
        # Like `python main.py` in the workspace: its files are importable.
        sys.path.insert(0, os.getcwd())
        if self.session is not None:
            self.session.restore(main)
            # Said now, not only at the end: a step killed for time or
            # memory leaves no final report, and its restored files must
            # not come back as its artifacts.
            self.send_report(only=_SESSION_EARLY_KEYS)
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as e:
            sys.stderr.write("the code is not valid UTF-8: %s\n" % e)
            self.fields["kind"] = "exception"
            self.fields["error"] = "the code is not valid UTF-8 (byte %d)" % e.start
            return 1
        # Tracebacks show the code's lines: linecache keeps entries whose
        # mtime is None, and a file main.py in the workspace cannot shadow it.
        linecache.cache["main.py"] = (len(text), None, text.splitlines(True), "main.py")
        # display() is a builtin, not one of the code's globals: a session
        # does not carry it.
        builtins.display = self.outputs.display
        try:
            body, last = _compile_cell(text)
            exec(body, main.__dict__)
            if last is not None:
                value = eval(last, main.__dict__)
                if value is not None:
                    self.outputs.add("result", value)
        except SystemExit as e:
            if e.code is None:
                return 0
            if isinstance(e.code, int):
                return e.code
            sys.stderr.write(str(e.code) + "\n")
            return 1
        except BaseException as e:  # noqa: B036 - the code's failure, reported
            if isinstance(e, MemoryError):
                # Free what the code held before formatting anything.
                main.__dict__.clear()
            self.print_traceback(e)
            self.fail(e)
            e.__traceback__ = None
            return 1
        return 0

    def save_figures(self):
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            nums = plt.get_fignums()
        except Exception:
            return
        n = 1
        for num in nums[:_MAX_FIGURES]:
            while True:
                name = "figure-%d.png" % n
                n += 1
                try:
                    f = open(name, "xb")  # O_EXCL: never overwrite, never follow
                except FileExistsError:
                    continue
                break
            try:
                with f:
                    plt.figure(num).savefig(f, format="png")
            except Exception as e:
                sys.stderr.write("could not save figure %d as %s: %s\n" % (num, name, _describe(e)))
        if len(nums) > _MAX_FIGURES:
            sys.stderr.write("only the first %d open figures were saved\n" % _MAX_FIGURES)


def _main():
    driver = _Driver()
    source = driver.open_channels()
    driver.session = _Session.open(driver.fields)
    pid = os.getpid()
    code = driver.run(source)
    if os.getpid() != pid:
        # A child the code forked ran off the end of the script: the figures
        # and the report belong to the main process only.
        return code
    try:
        driver.save_figures()
    except BaseException as e:  # noqa: B036 - never lose the report
        sys.stderr.write("could not save the figures: %s\n" % _describe(e))
    try:
        driver.outputs.write()
    except BaseException as e:  # noqa: B036 - never lose the report
        sys.stderr.write("could not write the outputs: %s\n" % _describe(e))
    # After a MemoryError the code's globals are gone: the previous state
    # stands (the worker keeps it).
    if driver.session is not None and driver.fields.get("kind") != "memory":
        try:
            driver.session.save(driver.main)
        except BaseException as e:  # noqa: B036 - never lose the report
            driver.fields["session_state_error"] = "the state could not be made (%s)" % (
                _describe(e))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # The restored files' list went out before the code ran: not twice,
    # its size could crowd the rest out of the report's cap.
    driver.send_report(skip=("session_files",))
    return code


# What the zygote imports before it forks: the runtime and what the driver
# itself needs. Imports only: no code of a task, no state but modules.
_WARM_IMPORTS = (
    "numpy", "pandas", "matplotlib", "matplotlib.pyplot", "matplotlib.backends.backend_agg",
    "openpyxl", "random", "threading", "atexit", "builtins", "linecache", "types",
    "traceback", "fcntl", "errno", "dill", "pickle", "hashlib", "io", "stat", "ast", "json",
    "base64",
)

# What the runtime imports only when a task first needs it, imported in the
# zygote too (best effort: a module missing from another version of the
# runtime is no failure): to_html (a DataFrame as a rich output), to_csv,
# to_excel, pivot/unstack, DataFrame.plot (pandas' matplotlib backend, with
# importlib.metadata and email). Measured (a zygote-like python3 forking
# children; issue 16): each of these paid 1-33 imports in every child; with
# them here, the children of 12 kinds of task faulted up to 10% fewer pages
# (none more) and kept up to 1.2 MiB less unique memory; the zygote grew by
# ~0.9 MiB, which its malloc_trim() gives back.
_WARM_LAZY_IMPORTS = (
    "pandas.io.formats.html", "pandas.io.formats.csvs", "pandas.io.formats.excel",
    "pandas.core.reshape.reshape", "pandas.plotting._matplotlib", "encodings.cp437",
)


def _warm_pandas():
    """csv parsing, arithmetic, groupby and text output."""
    import io
    import warnings
    import pandas as pd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = pd.read_csv(io.StringIO("k,x,y\na,1,2.5\nb,2,3.5\na,3,4.5\n"))
        df["z"] = df["x"] * df["y"]
        df.groupby("k")["z"].sum().to_string()


def _warm_driver():
    """What the driver does for every task around its code: reseed, wrap a
    stream in text, compile into a fresh module, read /proc. Nothing is
    kept: the stream is a BytesIO, the module is in no sys.modules."""
    import io
    import types
    _reseed()
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    stream.reconfigure(line_buffering=True)
    stream.write("x\n")
    stream.close()
    exec(compile("x = 1\n", "main.py", "exec"), types.ModuleType("__main__").__dict__)
    _peak_kb()


def _warm_session():
    """A session step's save and restore, in memory: dill's first use costs
    ~6 ms (its dispatch, lazy lookups), paid here instead of by a step. The
    module is a throwaway; __main__ is put back."""
    import io
    import types
    import dill
    import pandas as pd
    old = sys.modules.get("__main__")
    main = types.ModuleType("__main__")
    try:
        sys.modules["__main__"] = main
        exec(compile("def f():\n    return x\nclass K:\n    pass\nx = 1\n", "main.py", "exec"),
             main.__dict__)
        pickler, buf = _state_pickler(main)
        pickler.dump({"f": main.f, "K": main.K, "k": main.K(), "pd": pd,
                      "df": pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})})
        unpickler = dill.Unpickler(io.BytesIO(buf.getvalue()))
        unpickler._main = types.ModuleType("__main__")
        unpickler.load()
    finally:
        if old is not None:
            sys.modules["__main__"] = old


def _warm_describe():
    """describe() and a little linear algebra."""
    import warnings
    import numpy as np
    import pandas as pd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.DataFrame({"x": [1.0, 2.0, 3.0]}).describe().to_string()
        np.linalg.inv(np.eye(3) * 2.0) @ np.ones(3)


def _warm_matplotlib():
    """A figure saved as PNG into memory, font lookup included."""
    import gc
    import io
    import warnings
    import matplotlib.pyplot as plt
    import matplotlib.font_manager as fm
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig, ax = plt.subplots()
            ax.plot([1, 2, 3], [1, 4, 9])
            ax.set_title("warm")
            fig.savefig(io.BytesIO(), format="png")
    finally:
        plt.close("all")
        # Open font files must not outlive this: a child closes every fd.
        clear = getattr(getattr(fm, "_get_font", None), "cache_clear", None)
        if clear is not None:
            clear()
        gc.collect()  # the figure's cycles


def _warm_exercise():
    """One small run through what tasks use most, so that the lazy imports
    and caches it fills (csv parsing, groupby, PNG output, font lookup) are
    filled once in the zygote instead of in every child. It leaves nothing a
    task could see: no figure stays open, no option changes (the random
    generators are only reseeded from the OS, as every task does again),
    warnings are ignored (an ignored warning is not recorded as shown), and
    no file stays open (matplotlib's font objects keep theirs: they go).
    tests/security/fresh_state.test.mjs compares what a task finds with a
    fresh python3.

    More did not pay (measured with a zygote-like python3 forking children,
    issue 16): what runs here and is freed leaves the zygote's heap behind
    it, and the children of other kinds of task then fault more pages. A
    broader run (agg, pivot, merge, to_csv, to_excel, dates, DataFrame.plot)
    made the plain pandas task's child fault ~9% more pages; DataFrame.plot
    alone, run first, 2% more, for 13% fewer in a DataFrame.plot task's
    child, and the zygote kept 2.4 MiB more, which every fork copies the
    page table of. Importing what those paths import lazily
    (_WARM_LAZY_IMPORTS) is what helped every kind of task."""
    for step in _warm_up() + (_warm_matplotlib,):
        step()


def _warm_prepare():
    """In the zygote, once: import the runtime and exercise it, then freeze
    the heap so that the children's garbage collections do not copy its
    pages. The zygote checks afterwards that no thread and no fd is left."""
    import gc
    import importlib
    for name in _WARM_IMPORTS:
        importlib.import_module(name)
    for name in _WARM_LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _warm_exercise()
    gc.collect()
    gc.freeze()


def _warm_up():
    """The steps a spare task process (forked ahead of any task, waiting for
    one afterwards) runs again, most used first, so that its own first calls
    and copy-on-write faults are paid before a task exists rather than by it;
    it stops between two steps once its task has come. Our fixed code only:
    no task data, no file written (StringIO, BytesIO), nothing left that a
    task could see. Not matplotlib's: the pages it would copy (~11 MiB) are
    the spare's own, and would take a warm child past 16 MiB of unique
    memory; the zygote's exercise runs it once for all."""
    return (_warm_driver, _warm_pandas, _warm_session, _warm_describe)


def _reseed():
    """A forked child shares its parent's generators: reseed them from the OS."""
    import random
    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _exit_like_python(code):
    """What Python's exit does that a task can observe, then _exit(): wait for
    non-daemon threads, run atexit callbacks, flush the streams."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # noqa: B036 - the exit must happen
            pass
    atexit = sys.modules.get("atexit")
    if atexit is not None:
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: B036
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: B036
            pass
    os._exit(code & 0xFF)


def _warm_main():
    """In a child of the zygote, once per task: run the task, then exit."""
    code = 1
    try:
        _reseed()
        # logging's relativeCreated counts from its import: the task's start,
        # as in a fresh python3, not the zygote's.
        logging = sys.modules.get("logging")
        if logging is not None:
            import time
            logging._startTime = time.time()
        code = _main()
    except BaseException as e:  # noqa: B036 - like an uncaught exception at exit
        try:
            import traceback
            traceback.print_exception(e)
        except BaseException:  # noqa: B036
            pass
    _exit_like_python(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    sys.exit(_main())
