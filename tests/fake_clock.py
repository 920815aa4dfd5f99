"""A clock for tests of choices made by timing (`engine.kvcache.column_sums`, `key_layout`): it
moves only when a timed way is called, by that way's cost, so which way is faster does not depend
on this machine or its load. Patch it in as the module's `time`, and each way as `costing(way, s)`."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def costing(self, function, seconds):
        def way(*args, **kwargs):
            self.now += seconds
            return function(*args, **kwargs)
        return way
