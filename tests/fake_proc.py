"""/proc as tests script it (web/quiet.py's CpuReader): shared by the quiet-rule and start-up tests."""

from __future__ import annotations

from web.quiet import CpuTimes


class FakeProc:
    """/proc as a test scripts it: each reading is one more second of a machine of ``cores`` cores on which this
    process keeps ``own`` cores busy and other processes ``others`` cores (set between readings)."""

    def __init__(self, cores: int = 2, others: float = 0.0, own: float = 1.0) -> None:
        self.cores, self.others, self.own = cores, others, own
        self.total = self.busy = self.mine = 0

    def __call__(self) -> CpuTimes:
        from web import quiet
        hz = quiet.USER_HZ
        self.total += self.cores * hz
        self.busy += round((self.others + self.own) * hz)
        self.mine += round(self.own * hz)
        return CpuTimes(self.total, self.busy, self.mine, self.cores)
