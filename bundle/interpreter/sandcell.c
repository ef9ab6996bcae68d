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
#include <stdlib.h>
#include <string.h>
#include <wasi/api.h>
#include <wasi/libc.h>

static PyObject *run_function;

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

    /* As `python -I -S` configures itself (Py_BytesMain with those flags): the
     * Python configuration, isolated, no site; UTF-8 mode as the locale decides. */
    PyPreConfig pre;
    PyPreConfig_InitPythonConfig(&pre);
    pre.isolated = 1;
    pre.use_environment = 0;
    PyStatus st = Py_PreInitialize(&pre);
    if (PyStatus_Exception(st)) return 3;
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
