# sqlite3 in memory: a table filled by executemany, an index, grouped and joined
# queries.
import sqlite3


def bench():
    db = sqlite3.connect(":memory:")
    db.execute("create table t (id integer primary key, k text, v real)")
    db.executemany("insert into t (k, v) values (?, ?)", (("k%d" % (i % 50), i * 0.5) for i in range(5000)))
    db.execute("create index tk on t (k)")
    db.execute("select k, count(*), avg(v) from t group by k order by k").fetchall()
    db.execute("select count(*) from t a join t b on a.id = b.id + 1 where a.k = 'k7'").fetchall()
    db.close()
