# Sandcell's SQL tool, run as guest code in a hardened worker: untrusted SQL and an
# untrusted database file are parsed only here, inside WebAssembly.
#
# stdin: {"db": "/ws/PATH", "sql": ..., "params": [...] or {...}, "max_rows": N,
#         "write": false, "timeout_ms": N, "db_sha256": "" or the file's SHA-256 an
#         approved write was approved on, "recover": true to only undo a stopped
#         worker's lock and journal (see recover)}
# stdout: one JSON object (see sqltool.go, Outcome).
#
# Classification is SQLite's own: the statement is compiled with EXPLAIN on a
# read-only connection under an authorizer, and the bytecode says whether it writes
# (a write transaction, VACUUM, a schema cookie ...), never a keyword match.
import base64, hashlib, json, os, sqlite3, sys, time, urllib.parse

req = json.load(sys.stdin)
out = {"classification": None}
start = time.monotonic()
deadline = start + req["timeout_ms"] / 1000

# Actions refused with or without approval (authorizer codes, sqlite3_set_authorizer).
REFUSED_CODES = {sqlite3.SQLITE_ATTACH: "ATTACH", sqlite3.SQLITE_DETACH: "DETACH"}
# PRAGMAs refused: they name files, make the schema writable, or undo the
# connection's own protections.
REFUSED_PRAGMAS = {"writable_schema", "temp_store_directory", "data_store_directory",
                   "trusted_schema", "query_only", "cell_size_check", "schema_version",
                   "mmap_size", "locking_mode"}
# PRAGMAs that take an argument and only read (anything else with an argument writes).
READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_info", "index_xinfo",
                "index_list", "foreign_key_list", "foreign_key_check", "integrity_check",
                "quick_check", "function_list", "pragma_list", "collation_list",
                "database_list", "compile_options", "module_list"}
# Bytecode that only a writing statement has (sqlite3_stmt_readonly's rule, seen from
# EXPLAIN): P2 of Transaction says write; the rest change files or the schema.
# (Insert and Delete are not here: they also fill the ephemeral tables of a read, a
# recursive CTE for one; writing a real table needs OpenWrite.)
# (JournalMode is not here: reading the mode runs it too; setting it is a PRAGMA with a
# value, which counts as a write.)
WRITE_OPS = {"Vacuum", "AutoCommit", "Savepoint", "SetCookie", "CreateBtree",
             "Destroy", "Clear", "ParseSchema", "IncrVacuum", "OpenWrite", "VBegin", "VUpdate",
             "VCreate", "VDestroy"}


def cell(v):
    """A value as JSON can carry it: blobs as {"base64"}, integers beyond 2**53 and
    infinities (JSON has no number for them, RFC 8259 section 6) as strings."""
    if isinstance(v, bytes):
        return {"base64": base64.b64encode(v).decode()}
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53:
        return str(v)
    if isinstance(v, float) and v != v:
        return None  # SQLite stores NaN as NULL; never seen, kept for safety
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def finish(**kw):
    out.update(kw)
    out["elapsed_ms"] = round((time.monotonic() - start) * 1000, 3)
    json.dump(out, sys.stdout, allow_nan=False)
    sys.exit(0)


def error(e):
    msg = str(e)
    code = "sql_error"
    name = getattr(e, "sqlite_errorname", "")
    if isinstance(e, sqlite3.ProgrammingError) and "one statement" in msg:
        finish(status="refused", reason="more than one statement")
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        code = "sql_not_a_database"
    elif name in ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_READONLY_ROLLBACK"):
        # (READONLY_ROLLBACK: a writer stopped mid-transaction left a hot journal,
        # which a read-only connection cannot play back.)
        code = "sql_busy"
    elif name == "SQLITE_INTERRUPT" or "interrupted" in msg:
        code = "sql_interrupted"
    elif name == "SQLITE_CANTOPEN":
        code = "sql_cannot_open"
    elif name == "SQLITE_AUTH":
        code = "sql_not_authorized"
    elif "syntax error" in msg or "incomplete input" in msg or "unrecognized token" in msg:
        code = "sql_syntax_error"
    finish(status="error", error={"code": code, "message": msg, "sqlite": name})


def file_sha256():
    """The database file's SHA-256, hashed here, inside the worker's limits: the
    daemon never reads a file the guest controls (a sparse file is gigabytes that
    cost nothing on disk), and only a write, held for approval, is hashed."""
    h = hashlib.sha256()
    try:
        with open(req["db"], "rb") as f:
            while b := f.read(1 << 20):
                h.update(b)
    except OSError as e:
        finish(status="error", error={"code": "sql_cannot_open", "message": "cannot read the database file: " + e.strerror})
    return h.hexdigest()


def connect(write, vfs=""):
    mode = "rw" if write else "ro"
    uri = "file:" + urllib.parse.quote(req["db"]) + "?mode=" + mode + ("&vfs=" + vfs if vfs else "")
    # A lock held by a run is waited for a while (SQLite's busy handler), not for the
    # whole statement's time.
    c = sqlite3.connect(uri, uri=True, autocommit=True, timeout=2.0)
    # Hostile database files: no trusted schema, defensive mode, small limits.
    c.setconfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE, True)
    c.setconfig(sqlite3.SQLITE_DBCONFIG_TRUSTED_SCHEMA, False)
    # Triggers never fire, not even in an approved write: what was approved (the
    # statement, its bytecode) is all that runs; a hostile file's trigger does nothing.
    c.setconfig(sqlite3.SQLITE_DBCONFIG_ENABLE_TRIGGER, False)
    c.setconfig(sqlite3.SQLITE_DBCONFIG_ENABLE_VIEW, True)
    for limit, value in ((sqlite3.SQLITE_LIMIT_LENGTH, 16 << 20), (sqlite3.SQLITE_LIMIT_SQL_LENGTH, 1 << 20),
                         (sqlite3.SQLITE_LIMIT_COLUMN, 1000), (sqlite3.SQLITE_LIMIT_EXPR_DEPTH, 200),
                         (sqlite3.SQLITE_LIMIT_COMPOUND_SELECT, 100), (sqlite3.SQLITE_LIMIT_VDBE_OP, 1_000_000),
                         (sqlite3.SQLITE_LIMIT_FUNCTION_ARG, 32), (sqlite3.SQLITE_LIMIT_ATTACHED, 0),
                         (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1000), (sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 1000),
                         (sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH, 10)):
        c.setlimit(limit, value)
    # Temporary tables and sort files stay in memory (bounded by the worker's): no
    # temporary file is written into the workspace, not even by a read.
    c.execute("PRAGMA temp_store = MEMORY")
    if not write:
        c.execute("PRAGMA query_only = ON")
    # The time limit: the progress handler stops the statement (SQLITE_INTERRUPT).
    c.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    return c


actions, refused = [], []


def authorizer(code, a1, a2, db, trigger):
    if code in REFUSED_CODES:
        refused.append(REFUSED_CODES[code] + (" " + a1 if a1 else ""))
        return sqlite3.SQLITE_DENY
    if code == sqlite3.SQLITE_PRAGMA:
        name = (a1 or "").lower()
        if name in REFUSED_PRAGMAS:
            refused.append("PRAGMA " + name)
            return sqlite3.SQLITE_DENY
        if a2 is not None and name not in READ_PRAGMAS:
            actions.append("PRAGMA " + name + " = " + a2)
    if code == sqlite3.SQLITE_FUNCTION and (a2 or "").lower() in ("load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"):
        refused.append("function " + a2)
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def param(p):
    if isinstance(p, dict):
        if set(p) != {"base64"} or not isinstance(p["base64"], str):
            finish(status="error", error={"code": "sql_error", "message": 'a parameter object must be {"base64": "..."}'})
        try:
            return base64.b64decode(p["base64"], validate=True)
        except ValueError as e:
            finish(status="error", error={"code": "sql_error", "message": "a blob parameter is not base64: " + str(e)})
    if isinstance(p, int) and not isinstance(p, bool) and not -(2**63) <= p < 2**63:
        finish(status="error", error={"code": "sql_error", "message": "an integer parameter is beyond 64 bits"})
    if isinstance(p, list):
        finish(status="error", error={"code": "sql_error", "message": "a parameter cannot be an array"})
    return p


def recover():
    """Undoes what a worker stopped while it held the database leaves behind: SQLite's
    lock between programs here is a directory, DB.lock (WASI has no fcntl locks; see
    bundle/interpreter/sandcell.c), which outlives its holder, and a hot rollback
    journal. The journal is played back through the unix-none VFS, which takes no
    lock: the daemon asks for this only while nothing else uses the workspace, so no
    live holder can own the lock, and none needs taking."""
    lock, journal = req["db"] + ".lock", req["db"] + "-journal"
    found = {"lock_removed": False, "journal_rolled_back": False}
    try:
        os.rmdir(lock)
        found["lock_removed"] = True
    except FileNotFoundError:
        pass
    except OSError as e:
        finish(status="error", error={"code": "sql_busy", "message": "the lock %s cannot be removed: %s" % (lock[4:], e.strerror)})
    hot = os.path.exists(journal) and os.path.getsize(journal) > 0
    try:
        c = connect(True, vfs="unix-none")
        c.execute("SELECT 1 FROM sqlite_schema LIMIT 1").fetchall()  # plays a hot journal back
        c.close()
    except sqlite3.Error as e:
        error(e)
    found["journal_rolled_back"] = hot and not (os.path.exists(journal) and os.path.getsize(journal) > 0)
    finish(status="ok", recovered=found)


if req.get("recover"):
    recover()

params = req.get("params")
if params is None:
    params = ()
elif isinstance(params, list):
    params = tuple(param(p) for p in params)
else:
    params = {k: param(v) for k, v in params.items()}

# The result is bounded before it is built: past this many bytes of JSON rows the
# statement stops (the worker's output cap is larger).
MAX_RESULT = 24 << 20

if req["write"] and req.get("db_sha256") and file_sha256() != req["db_sha256"]:
    # The approver approved the statement on the bytes they could inspect.
    finish(status="stale", reason="the database file changed since the approval was requested")

try:
    conn = connect(False)
    conn.set_authorizer(authorizer)
    # Compile only: EXPLAIN runs nothing but shows the bytecode.
    ops = set()
    vacuum_into = False
    try:
        for row in conn.execute("EXPLAIN " + req["sql"], params):
            ops.add(row[1])
            if row[1] == "Vacuum" and row[3]:
                vacuum_into = True
            if row[1] == "Transaction" and row[3]:
                ops.add("Transaction(write)")
    except sqlite3.Error as e:
        if refused:
            finish(status="refused", reason="refused: " + ", ".join(refused))
        # EXPLAIN EXPLAIN ... is not SQL: an EXPLAIN statement only reads.
        if not req["sql"].lstrip()[:7].upper() == "EXPLAIN":
            error(e)
        ops = set()
    if refused or vacuum_into:
        finish(status="refused", reason="refused: " + ", ".join(refused or ["VACUUM INTO"]))
    if ops & {"AutoCommit", "Savepoint"}:
        # One statement is its own transaction: BEGIN, COMMIT, SAVEPOINT have no use.
        finish(status="refused", reason="refused: transaction control (each statement runs in its own transaction)")
    writes = sorted(ops & (WRITE_OPS | {"Transaction(write)"}))
    kind = "write" if writes or actions else "read"
    # (a copy: compiling again on a read-write connection runs the authorizer again)
    out["classification"] = {"kind": kind, "bytecode": writes, "pragmas": list(actions)}
    if kind == "write" and not req["write"]:
        finish(status="approval_required", db_sha256=file_sha256())
    if kind == "write":
        conn.close()
        conn = connect(True)
        conn.set_authorizer(authorizer)
    cur = conn.execute(req["sql"], params)
    columns = [{"name": d[0]} for d in (cur.description or [])]
    rows, truncated, size = [], False, 0
    for row in cur:
        if len(rows) >= req["max_rows"]:
            truncated = True
            break
        row = [cell(v) for v in row]
        size += len(json.dumps(row, allow_nan=False))
        if size > MAX_RESULT:
            finish(status="error", error={"code": "sql_result_too_large",
                                          "message": "the result is over %d bytes: ask for fewer rows (max_rows)" % MAX_RESULT})
        rows.append(row)
    cur.close()
    if columns and kind == "read":
        # Declared types as SQLite reports them for a view over the statement
        # (sqlite3_column_decltype is not in Python's API); none for statements a view
        # cannot hold (PRAGMA, EXPLAIN, parameters).
        try:
            types = connect(False)
            types.set_authorizer(lambda code, a1, a2, db, t: sqlite3.SQLITE_DENY if code in REFUSED_CODES else sqlite3.SQLITE_OK)
            types.execute("PRAGMA temp_store = MEMORY")
            types.execute("PRAGMA query_only = OFF")
            types.execute("CREATE TEMP VIEW sandcell_columns AS " + req["sql"])
            for col, info in zip(columns, types.execute("PRAGMA temp.table_xinfo(sandcell_columns)")):
                col["decl_type"] = info[2] or None
        except sqlite3.Error:
            pass
    finish(status="ok", columns=columns, rows=rows, truncated=truncated,
           changes=conn.total_changes if kind == "write" else 0)
except sqlite3.Error as e:
    error(e)
except MemoryError:
    finish(status="error", error={"code": "sql_result_too_large", "message": "the statement ran out of memory"})
except (ValueError, TypeError, OverflowError) as e:
    # Bad parameters or values Python cannot bind.
    finish(status="error", error={"code": "sql_error", "message": str(e)})
