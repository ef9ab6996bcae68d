/* The interpreter's entry points. python.wasm is a WASI reactor (no _start): the host
 * calls _initialize (wasi-libc's constructors), then sandcell_init once, then takes a
 * snapshot of the instance's memory and globals; every run instantiates that snapshot
 * afresh and calls sandcell_run once.
 *
 *   sandcell_init   WASI argv: [name, HASH-SEED, INIT-SOURCE]. Initialises CPython as
 *                   `python -S -I` would, with that hash seed, and runs INIT-SOURCE in
 *                   __main__; INIT-SOURCE defines _sandcell_run, which is taken out of
 *                   __main__ and kept here. Returns 0, or a nonzero step number.
 *   sandcell_run    Registers this instance's preopened directories and calls
 *                   _sandcell_run(), which reads, runs and ends one program. Returns
 *                   its exit status (0-255), plus 256 when the program ended with an
 *                   uncaught MemoryError. Once per instance.
 *
 * Nothing else reads the WASI environment or argv: a run's environment and arguments
 * come with its program.
 */
#include <Python.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wasi/api.h>
#include <wasi/libc.h>

static PyObject *run_function;

/* SQLite's locks.
 *
 * WASI has no fcntl locks, so SQLite's WASI build locks with a directory beside the
 * database (DB.lock, its unix-dotfile VFS), held while any connection holds any
 * lock. Two connections of one program then exclude each other even for reading: a
 * second connection to a file another has written to (an open transaction) gets
 * "database is locked", where on POSIX it reads the last committed state.
 *
 * SQLite's "unix" VFS shares each file's lock among the connections of a process (as
 * POSIX locks belong to the process) and asks the system only for the process's own
 * lock, through fcntl(F_SETLK, F_GETLK). Here that fcntl is answered with the same
 * DB.lock directory: made when the process's first byte range of the file is locked,
 * removed when its last is unlocked. So within a program connections lock as on
 * POSIX (readers beside one writer), and between programs (two runs on one
 * workspace, the SQL tool) the lock is the directory it always was: one program at a
 * time, and a holder stopped in a transaction leaves it behind as before. */

/* A descriptor SQLite opened, with the path it opened it by (absolute: SQLite's
 * xFullPathname). */
struct db_fd {
    int fd;
    dev_t dev;
    ino_t ino;
    char *path;
};

/* A file the process holds locks on: its identity, its lock directory and the byte
 * ranges locked ([start, end), end INT64_MAX for "to the end"). */
struct db_lock {
    dev_t dev;
    ino_t ino;
    char *dir;
    int n;
    int64_t start[16], end[16];
};

/* wasi-libc defines struct flock but not the commands and lock types: these are the
 * values SQLite's os_unix.c gives them on WASI, which it passes here. */
#ifndef F_RDLCK
#define F_RDLCK 0
#define F_WRLCK 1
#define F_UNLCK 2
#if __LONG_MAX == 0x7fffffffL
#define F_GETLK 12
#define F_SETLK 13
#else
#define F_GETLK 5
#define F_SETLK 6
#endif
#endif

static struct db_fd db_fds[256];
static struct db_lock db_locks[128];
static int (*sys_open)(const char *, int, int);
static int (*sys_close)(int);
static int (*sys_fcntl)(int, int, ...);

static int db_open(const char *path, int flags, int mode) {
    int fd = sys_open(path, flags, mode);
    if (fd < 0) return fd;
    for (size_t i = 0; i < sizeof db_fds / sizeof db_fds[0]; i++) {
        if (db_fds[i].path == NULL) {
            struct stat st;
            char *p = strdup(path);
            if (p == NULL || fstat(fd, &st) != 0) {
                free(p);
                break;
            }
            db_fds[i].fd = fd;
            db_fds[i].dev = st.st_dev;
            db_fds[i].ino = st.st_ino;
            db_fds[i].path = p;
            return fd;
        }
    }
    /* Without its path the descriptor could not be locked: refuse it. */
    sys_close(fd);
    errno = EMFILE;
    return -1;
}

static int db_close(int fd) {
    for (size_t i = 0; i < sizeof db_fds / sizeof db_fds[0]; i++) {
        if (db_fds[i].path != NULL && db_fds[i].fd == fd) {
            free(db_fds[i].path);
            db_fds[i].path = NULL;
        }
    }
    return sys_close(fd);
}

static const char *db_path(int fd) {
    for (size_t i = 0; i < sizeof db_fds / sizeof db_fds[0]; i++) {
        if (db_fds[i].path != NULL && db_fds[i].fd == fd) return db_fds[i].path;
    }
    return NULL;
}

/* db_lock_of returns the lock entry of fd's file, or NULL (then errno is set); with
 * create, a free entry is taken for a file that has none. */
static struct db_lock *db_lock_of(int fd, int create) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    struct db_lock *free_entry = NULL;
    for (size_t i = 0; i < sizeof db_locks / sizeof db_locks[0]; i++) {
        struct db_lock *l = &db_locks[i];
        if (l->dir != NULL && l->dev == st.st_dev && l->ino == st.st_ino) return l;
        if (l->dir == NULL && free_entry == NULL) free_entry = l;
    }
    if (!create) return NULL;
    const char *path = db_path(fd);
    if (path == NULL || free_entry == NULL) {
        errno = ENOLCK;
        return NULL;
    }
    size_t len = strlen(path);
    char *dir = malloc(len + 6);
    if (dir == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    memcpy(dir, path, len);
    memcpy(dir + len, ".lock", 6);
    free_entry->dev = st.st_dev;
    free_entry->ino = st.st_ino;
    free_entry->dir = dir;
    free_entry->n = 0;
    return free_entry;
}

/* db_unlock_range removes [start, end) from l's ranges, splitting one that spans it. */
static int db_unlock_range(struct db_lock *l, int64_t start, int64_t end) {
    for (int i = 0; i < l->n; i++) {
        if (l->end[i] <= start || l->start[i] >= end) continue;
        if (l->start[i] < start && l->end[i] > end) {
            if (l->n == 16) return -1;
            l->start[l->n] = end;
            l->end[l->n] = l->end[i];
            l->n++;
            l->end[i] = start;
        } else if (l->start[i] < start) {
            l->end[i] = start;
        } else if (l->end[i] > end) {
            l->start[i] = end;
        } else {
            l->start[i] = l->start[l->n - 1];
            l->end[i] = l->end[l->n - 1];
            l->n--;
            i--;
        }
    }
    return 0;
}

static int db_fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    if (cmd != F_SETLK && cmd != F_GETLK) {
        int arg = va_arg(ap, int);
        va_end(ap);
        return sys_fcntl(fd, cmd, arg);
    }
    struct flock *fl = va_arg(ap, struct flock *);
    va_end(ap);
    if (fl->l_whence != SEEK_SET || fl->l_start < 0 || fl->l_len < 0) {
        errno = EINVAL;
        return -1;
    }
    int64_t start = fl->l_start, end = fl->l_len == 0 ? INT64_MAX : fl->l_start + fl->l_len;
    struct db_lock *l = db_lock_of(fd, cmd == F_SETLK && fl->l_type != F_UNLCK);
    if (cmd == F_GETLK) {
        /* Conflicting locks are another process's: the directory, when this
         * process does not hold it. */
        struct stat st;
        if (l == NULL || l->n == 0) {
            const char *path = db_path(fd);
            char buf[4096];
            if (path != NULL && snprintf(buf, sizeof buf, "%s.lock", path) < (int)sizeof buf &&
                stat(buf, &st) == 0) {
                fl->l_type = F_WRLCK;
                fl->l_pid = 0;
                return 0;
            }
        }
        fl->l_type = F_UNLCK;
        return 0;
    }
    if (fl->l_type == F_UNLCK) {
        if (l == NULL || l->n == 0) return 0;
        if (db_unlock_range(l, start, end) != 0) {
            errno = ENOLCK;
            return -1;
        }
        if (l->n == 0) {
            rmdir(l->dir);
            free(l->dir);
            l->dir = NULL;
        }
        return 0;
    }
    if (l == NULL) return -1;
    if (l->n == 0 && mkdir(l->dir, 0777) != 0) {
        int e = errno;
        free(l->dir);
        l->dir = NULL;
        errno = (e == EEXIST) ? EAGAIN : e;
        return -1;
    }
    if (db_unlock_range(l, start, end) != 0 || l->n == 16) {
        errno = ENOLCK;
        return -1;
    }
    l->start[l->n] = start;
    l->end[l->n] = end;
    l->n++;
    return 0;
}

/* db_forget is called when the interpreter was restored (a session rolled back
 * after a cell past its limits, or resumed from a checkpoint in another worker): its
 * memory holds the tables as they were before, not as they are. Descriptors this
 * instance does not have (a resumed one has none of its files) are dropped, and every
 * lock is forgotten without removing its directory, which may by now be another
 * program's (one that was this program's stays behind, as a stopped program's does).
 * The files themselves the bootstrap closes next. */
static void db_forget(void) {
    for (size_t i = 0; i < sizeof db_fds / sizeof db_fds[0]; i++) {
        struct stat st;
        if (db_fds[i].path == NULL) continue;
        if (fstat(db_fds[i].fd, &st) != 0 || st.st_dev != db_fds[i].dev || st.st_ino != db_fds[i].ino) {
            free(db_fds[i].path);
            db_fds[i].path = NULL;
        }
    }
    for (size_t j = 0; j < sizeof db_locks / sizeof db_locks[0]; j++) {
        free(db_locks[j].dir);
        db_locks[j].dir = NULL;
        db_locks[j].n = 0;
    }
}

/* _sandcell, a built-in module for the bootstrap: forget_locks() is db_forget;
 * tool_call() is the guest's end of the tools channel (below);
 * reseed_sqlite() resets SQLite's generator, which seeds itself again from the VFS's
 * randomness (wasi_randomness, the worker's own) when next used: a fork must not
 * draw what its source draws (sqlite3_randomness with N = 0). */
static PyObject *forget_locks(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    db_forget();
    Py_RETURN_NONE;
}

static PyObject *reseed_sqlite(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    sqlite3_randomness(0, NULL);
    Py_RETURN_NONE;
}

/* tool_call(request: bytes) -> bytes is the guest's end of a tool call (see the
 * product's sandbox/protocol: the tools channel). The host (the worker) defines two
 * functions this module imports: sandcell.tool_call takes the request from linear
 * memory, carries it to the daemon and waits for its answer, returning the answer's
 * length in bytes (or -1: this run has no tools channel); sandcell.tool_answer then
 * copies the answer (its whole length, which the host bounds) into the buffer given.
 * Everything the call means is in the bytes; this is only the way across. */
__attribute__((import_module("sandcell"), import_name("tool_call")))
extern int64_t host_tool_call(const void *request, uint32_t length);
__attribute__((import_module("sandcell"), import_name("tool_answer")))
extern int32_t host_tool_answer(void *answer, uint32_t length);

static PyObject *tool_call(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer req;
    if (PyObject_GetBuffer(arg, &req, PyBUF_SIMPLE) != 0) return NULL;
    if ((uint64_t)req.len > UINT32_MAX) {
        PyBuffer_Release(&req);
        PyErr_SetString(PyExc_ValueError, "tool_call: request too large");
        return NULL;
    }
    int64_t n = host_tool_call(req.buf, (uint32_t)req.len);
    PyBuffer_Release(&req);
    if (n < 0) {
        PyErr_SetString(PyExc_RuntimeError, "tool_call: this run has no tools channel");
        return NULL;
    }
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "tool_call: answer too large");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
    if (out == NULL) return NULL; /* the host keeps the answer until the next call */
    if (host_tool_answer(PyBytes_AS_STRING(out), (uint32_t)n) != (int32_t)n) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "tool_call: the answer was not delivered");
        return NULL;
    }
    return out;
}

/* audit_hook(hook, events) makes hook(event, args) the bootstrap's audit hook for the
 * events named (a tuple of str), once. CPython calls an audit hook on every audited
 * event (builtins.id in copy.deepcopy, sys._getframe in logging, pickle.find_class,
 * ...); a hook added with sys.addaudithook is a Python call for each, which made
 * id() twelve times slower here. This one is a C hook (PySys_AddAuditHook) that
 * compares the event's name with the few the bootstrap checks and calls it for those
 * alone. It cannot be removed or replaced, as a hook added with sys.addaudithook
 * cannot. */
static PyObject *audit_target;
static char **audit_events;
static PyInterpreterState *audit_interp;

static int audit_dispatch(const char *event, PyObject *args, void *data) {
    (void)data;
    /* A C hook is the whole runtime's: a subinterpreter (with an allocator of its
     * own) must not call into the main interpreter's objects. It has no guard, as
     * with sys.addaudithook, which is per interpreter. */
    if (PyInterpreterState_Get() != audit_interp) return 0;
    for (char **e = audit_events; *e != NULL; e++) {
        if (strcmp(event, *e) == 0) {
            /* As CPython runs a hook of Python's: unseen by the program's tracers
             * and profilers (sys.settrace, sys.setprofile, sys.monitoring). */
            PyThreadState *ts = PyThreadState_Get();
            PyThreadState_EnterTracing(ts);
            PyObject *r = PyObject_CallFunction(audit_target, "sO", event, args);
            PyThreadState_LeaveTracing(ts);
            if (r == NULL) return -1;
            Py_DECREF(r);
            return 0;
        }
    }
    return 0;
}

static void free_events(char **events) {
    for (char **e = events; *e != NULL; e++) free(*e);
    PyMem_RawFree(events);
}

/* The bootstrap calls it once, while no hook of Python's is set (one that raised
 * RuntimeError at "sys.addaudithook" would keep the hook out without an error). */
static PyObject *audit_hook(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    (void)self;
    if (argc != 2 || !PyCallable_Check(argv[0]) || !PyTuple_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "audit_hook(hook, events): a callable and a tuple of str");
        return NULL;
    }
    if (audit_target != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "audit_hook: the hook is set");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(argv[1]);
    char **events = PyMem_RawCalloc((size_t)n + 1, sizeof(char *));
    if (events == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(argv[1], i);
        if (!PyUnicode_Check(item)) {
            free_events(events);
            PyErr_SetString(PyExc_TypeError, "audit_hook: events must be str");
            return NULL;
        }
        const char *name = PyUnicode_AsUTF8(item);
        if (name == NULL || (events[i] = strdup(name)) == NULL) {
            free_events(events);
            return name == NULL ? NULL : PyErr_NoMemory();
        }
    }
    /* Set before the hook exists, so that it never sees them half-made. */
    audit_events = events;
    audit_interp = PyInterpreterState_Get();
    audit_target = Py_NewRef(argv[0]);
    if (PySys_AddAuditHook(audit_dispatch, NULL) != 0) {
        Py_CLEAR(audit_target);
        audit_events = NULL;
        free_events(events);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "audit_hook: refused");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef sandcell_methods[] = {
    {"audit_hook", (PyCFunction)(void (*)(void))audit_hook, METH_FASTCALL, "Make hook(event, args) the audit hook of the events named, once."},
    {"forget_locks", forget_locks, METH_NOARGS, "Forget the SQLite locks a restored interpreter's memory lists."},
    {"reseed_sqlite", reseed_sqlite, METH_NOARGS, "Make SQLite's generator seed itself afresh when next used."},
    {"tool_call", tool_call, METH_O, "Send a tool call (bytes) to the host and return its answer (bytes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sandcell_module = {
    PyModuleDef_HEAD_INIT, "_sandcell", "Sandcell's entry points for its bootstrap.", -1, sandcell_methods,
    NULL, NULL, NULL, NULL,
};

static PyObject *init_sandcell_module(void) { return PyModule_Create(&sandcell_module); }

/* The directory reader: fdopendir, readdir, rewinddir, dirfd and closedir, which
 * CPython's os.listdir and os.scandir (and so pathlib, glob, os.walk and shutil)
 * call, defined here in place of wasi-libc's (whose opendir opens the directory and
 * calls fdopendir, so it makes one of these).
 *
 * WASI's fd_readdir returns the entries after a cookie into a buffer; wasmtime's
 * reads the directory afresh (and stats every entry) on every call, up to the cookie
 * and past it. wasi-libc reads 4 KiB at a time, about 120 names, so a listing of N
 * names cost N/120 calls of up to N stats each: 2,000 files took 2.8 s (64,020
 * statx(2) for one os.listdir) against 0.8 ms natively. This reader starts with 128
 * KiB (about 3,500 names: one call for most directories) and doubles its buffer (to
 * 4 MiB) each time one read filled it, so a larger one takes a few; an entry larger
 * than the buffer grows it to fit. The entries, their order and d_type are as
 * wasi-libc gives them, d_ino the host's (wasi-libc asks fstatat for an entry whose
 * d_ino is 0, which wasmtime never gives); like wasi-libc, an empty name or one
 * holding a NUL is skipped. telldir, seekdir and fdclosedir are here too, so that
 * none of wasi-libc's, which would read this DIR as theirs, can be linked. */
#define DIR_BUFFER_FIRST (128u << 10)
#define DIR_BUFFER_MOST (4u << 20)

struct _DIR {
    int fd;
    __wasi_dircookie_t cookie; /* of the last entry returned */
    char *buffer;
    size_t size, used, at; /* the buffer's size, the bytes the last read put in it, the next entry */
    int last;              /* the last read left part of the buffer unused: the directory's end */
    struct dirent *entry;
    size_t entry_size;
};

DIR *fdopendir(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return NULL;
    }
    DIR *d = calloc(1, sizeof *d);
    if (d == NULL) return NULL;
    d->buffer = malloc(DIR_BUFFER_FIRST);
    if (d->buffer == NULL) {
        free(d);
        return NULL;
    }
    d->fd = fd;
    d->size = DIR_BUFFER_FIRST;
    d->cookie = __WASI_DIRCOOKIE_START;
    return d;
}

int dirfd(DIR *d) { return d->fd; }

void rewinddir(DIR *d) { seekdir(d, (long)__WASI_DIRCOOKIE_START); }

long telldir(DIR *d) { return (long)d->cookie; }

void seekdir(DIR *d, long at) {
    d->cookie = (__wasi_dircookie_t)(unsigned long)at;
    d->used = d->at = 0;
    d->last = 0;
}

int fdclosedir(DIR *d) {
    int fd = d->fd;
    free(d->buffer);
    free(d->entry);
    free(d);
    return fd;
}

int closedir(DIR *d) { return close(fdclosedir(d)); }

/* fill reads the entries after d->cookie into the buffer, grown to at least want
 * bytes (and doubled when the last read filled it). It returns 0 or an errno. */
static int fill(DIR *d, size_t want) {
    size_t size = d->size;
    if (want > DIR_BUFFER_MOST) return EIO; /* no name is that long */
    if (d->used == d->size && d->used != 0 && size < DIR_BUFFER_MOST) size *= 2;
    while (size < want) size *= 2;
    if (size != d->size) {
        char *b = realloc(d->buffer, size);
        if (b == NULL) return ENOMEM;
        d->buffer = b;
        d->size = size;
    }
    __wasi_size_t used;
    __wasi_errno_t e = __wasi_fd_readdir(d->fd, (uint8_t *)d->buffer, (__wasi_size_t)d->size, d->cookie, &used);
    if (e != 0) return e;
    if (used > d->size) return EIO;
    d->used = used;
    d->at = 0;
    d->last = used < d->size;
    return 0;
}

struct dirent *readdir(DIR *d) {
    for (;;) {
        size_t left = d->used - d->at;
        if (left >= sizeof(__wasi_dirent_t)) {
            __wasi_dirent_t h;
            memcpy(&h, d->buffer + d->at, sizeof h);
            if (h.d_namlen > DIR_BUFFER_MOST) {
                errno = EIO; /* no name is that long (and the sum below would wrap) */
                return NULL;
            }
            size_t whole = sizeof h + h.d_namlen;
            if (left >= whole) {
                const char *name = d->buffer + d->at + sizeof h;
                if (h.d_namlen == 0 || memchr(name, 0, h.d_namlen) != NULL) {
                    d->at += whole;
                    d->cookie = h.d_next;
                    continue;
                }
                size_t need = offsetof(struct dirent, d_name) + h.d_namlen + 1;
                if (need > d->entry_size) {
                    struct dirent *n = realloc(d->entry, need);
                    if (n == NULL) {
                        errno = ENOMEM; /* the entry stays the next */
                        return NULL;
                    }
                    d->entry = n;
                    d->entry_size = need;
                }
                d->at += whole;
                d->cookie = h.d_next;
                d->entry->d_ino = h.d_ino;
                d->entry->d_type = h.d_type;
                memcpy(d->entry->d_name, name, h.d_namlen);
                d->entry->d_name[h.d_namlen] = 0;
                return d->entry;
            }
            if (d->last) return NULL; /* a cut entry at the end: none follows */
            /* Cut by the buffer's end: read again from the last whole entry, into a
             * buffer that holds this one. */
            int e = fill(d, whole);
            if (e != 0) {
                errno = e;
                return NULL;
            }
            continue;
        }
        if (d->last) return NULL; /* the end: errno unchanged */
        int e = fill(d, 0);
        if (e != 0) {
            errno = e;
            return NULL;
        }
        if (d->used == 0) return NULL;
    }
}

/* wasi_randomness is SQLite's source of randomness (the VFS's xRandomness): WASI's
 * random_get, the worker's own. The unix VFS's own reads /dev/urandom, which the
 * guest has not, and falls back to the time and the pid: every worker, and every
 * fork of a session, would draw the same random() and randomblob() within a second. */
static int wasi_randomness(sqlite3_vfs *vfs, int n, char *out) {
    (void)vfs;
    if (n <= 0 || __wasi_random_get((uint8_t *)out, (__wasi_size_t)n) != 0) return 0;
    return n;
}

/* sqlite_locks makes "unix", with the locks above and WASI's randomness, SQLite's
 * default VFS. */
static int sqlite_locks(void) {
    sqlite3_vfs *vfs = sqlite3_vfs_find("unix");
    if (vfs == NULL || vfs->iVersion < 3) return -1;
    sys_open = (int (*)(const char *, int, int))vfs->xGetSystemCall(vfs, "open");
    sys_close = (int (*)(int))vfs->xGetSystemCall(vfs, "close");
    sys_fcntl = (int (*)(int, int, ...))vfs->xGetSystemCall(vfs, "fcntl");
    if (!sys_open || !sys_close || !sys_fcntl) return -1;
    if (vfs->xSetSystemCall(vfs, "open", (sqlite3_syscall_ptr)db_open) != SQLITE_OK ||
        vfs->xSetSystemCall(vfs, "close", (sqlite3_syscall_ptr)db_close) != SQLITE_OK ||
        vfs->xSetSystemCall(vfs, "fcntl", (sqlite3_syscall_ptr)db_fcntl) != SQLITE_OK)
        return -1;
    vfs->xRandomness = wasi_randomness;
    return sqlite3_vfs_register(vfs, 1) == SQLITE_OK ? 0 : -1;
}

/* args: WASI argv, read directly (a reactor's libc never reads it). */
static char **args(size_t *argc) {
    size_t n, size;
    if (__wasi_args_sizes_get(&n, &size) != 0) return NULL;
    char **argv = calloc(n + 1, sizeof(char *));
    char *buf = malloc(size);
    if (!argv || !buf || __wasi_args_get((uint8_t **)argv, (uint8_t *)buf) != 0) return NULL;
    *argc = n;
    return argv;
}

__attribute__((export_name("sandcell_init")))
int sandcell_init(void) {
    size_t argc = 0;
    char **argv = args(&argc);
    if (!argv || argc != 3) return 1;
    char *end;
    unsigned long seed = strtoul(argv[1], &end, 10);
    if (*end != '\0' || seed > 4294967295UL) return 2;
    if (sqlite_locks() != 0) return 9;

    /* As `python -I -S` configures itself (Py_BytesMain with those flags): the
     * Python configuration, isolated, no site; UTF-8 mode as the locale decides. */
    PyPreConfig pre;
    PyPreConfig_InitPythonConfig(&pre);
    pre.isolated = 1;
    pre.use_environment = 0;
    PyStatus st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st)) return 3;
    if (PyImport_AppendInittab("_sandcell", init_sandcell_module) != 0) return 3;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.isolated = 1;    /* -I */
    config.site_import = 0; /* -S */
    config.use_hash_seed = 1;
    config.hash_seed = seed;
    config.parse_argv = 0;
    st = PyConfig_SetBytesString(&config, &config.program_name, "/usr/local/bin/python");
    if (!PyStatus_Exception(st)) {
        char *pargv[] = {"/usr/local/bin/python"};
        st = PyConfig_SetBytesArgv(&config, 1, pargv);
    }
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) return 3;

    if (PyRun_SimpleString(argv[2]) != 0) return 4;
    PyObject *main = PyImport_AddModule("__main__"); /* borrowed */
    if (!main) return 5;
    PyObject *dict = PyModule_GetDict(main);
    run_function = PyDict_GetItemString(dict, "_sandcell_run");
    if (!run_function || !PyCallable_Check(run_function)) return 6;
    Py_INCREF(run_function);
    if (PyDict_DelItemString(dict, "_sandcell_run") != 0) return 7;

    /* The snapshot must hold no descriptor but the standard streams and the
     * preopened library (fd 3): a run's descriptors are its own. */
    for (__wasi_fd_t fd = 4; fd < 1024; fd++) {
        __wasi_fdstat_t stat;
        if (__wasi_fd_fdstat_get(fd, &stat) != __WASI_ERRNO_BADF) return 8;
    }
    return 0;
}

/* register_preopens adds this instance's preopened directories to wasi-libc's table.
 * The table in the snapshot holds the library's entry from sandcell_init; entries
 * added later take precedence for the same prefix, so the run's own win. */
static int register_preopens(void) {
    for (__wasi_fd_t fd = 3; fd < 64; fd++) {
        __wasi_prestat_t pre;
        __wasi_errno_t err = __wasi_fd_prestat_get(fd, &pre);
        if (err == __WASI_ERRNO_BADF) return 0;
        if (err != 0) return -1;
        if (pre.tag != __WASI_PREOPENTYPE_DIR) continue;
        size_t len = pre.u.dir.pr_name_len;
        char *name = malloc(len + 1);
        if (!name || __wasi_fd_prestat_dir_name(fd, (uint8_t *)name, len) != 0) return -1;
        name[len] = '\0';
        int r = __wasilibc_register_preopened_fd(fd, name);
        free(name);
        if (r != 0) return -1;
    }
    return -1;
}

__attribute__((export_name("sandcell_run")))
int sandcell_run(void) {
    if (!run_function) return 125;
    if (register_preopens() != 0) return 125;
    int status = 1;
    PyObject *r = PyObject_CallNoArgs(run_function);
    if (r) {
        long v = PyLong_AsLong(r);
        /* 0-255, and 256 + status for a program that ran out of memory (see
         * bootstrap.py): a program's own exit status never reaches 256. */
        if (!(v == -1 && PyErr_Occurred())) status = (int)(v & 0x1FF);
        Py_DECREF(r);
    }
    if (PyErr_Occurred()) PyErr_Print();
    /* No Py_FinalizeEx: _sandcell_run has ended the program as finalization would,
     * as far as a program can see, and the instance is discarded. */
    return status;
}
