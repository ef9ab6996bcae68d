# str methods and formatting: f-strings, %, format, join, split, replace, case,
# non-ASCII text.
WORDS = ["alpha", "beta", "gamma", "d\u00e9lta", "\u4e2d\u6587", "epsilon"] * 50


def bench():
    for i in range(60):
        s = " ".join(WORDS)
        s.split()
        s.upper().lower()
        s.replace("a", "A").count("A")
        [f"{w}:{i:04d}" for w in WORDS]
        ["%s=%d" % (w, i) for w in WORDS]
        ["{0}/{1:.2f}".format(w, i / 3) for w in WORDS]
        s.encode("utf-8").decode("utf-8")
