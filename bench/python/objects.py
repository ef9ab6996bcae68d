# Method calls, attribute access and a small class hierarchy: a scheduler moving
# tasks between queues.
class Task:
    __slots__ = ("name", "work", "done")

    def __init__(self, name, work):
        self.name, self.work, self.done = name, work, 0

    def step(self):
        self.done += 1
        return self.done >= self.work


class Queue:
    def __init__(self):
        self.items = []

    def push(self, t):
        self.items.append(t)

    def pop(self):
        return self.items.pop(0) if self.items else None


class Scheduler:
    def __init__(self, n):
        self.ready, self.finished = Queue(), []
        for i in range(n):
            self.ready.push(Task("t%d" % i, 1 + i % 7))

    def run(self):
        while (t := self.ready.pop()) is not None:
            if t.step():
                self.finished.append(t)
            else:
                self.ready.push(t)
        return len(self.finished)


def bench():
    for _ in range(30):
        Scheduler(400).run()
