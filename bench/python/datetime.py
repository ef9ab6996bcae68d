# datetime: arithmetic, isoformat, fromisoformat, strftime and strptime.
import datetime as dt

START = dt.datetime(2024, 1, 1, 8, 30)


def bench():
    for i in range(1500):
        d = START + dt.timedelta(hours=i, minutes=i % 60)
        s = d.isoformat()
        dt.datetime.fromisoformat(s)
        d.strftime("%Y-%m-%d %H:%M")
        if i % 10 == 0:
            dt.datetime.strptime("2024-03-%02d 10:15" % (1 + i % 28), "%Y-%m-%d %H:%M")
