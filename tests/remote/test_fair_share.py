"""The engine's fair turns (``server/_fair.py``) driven in memory: who runs next, the deficit
fair-queuing bound, weights, a peer's many sessions, cancellation, and the thread/trio wakes."""

from __future__ import annotations

import threading

import pytest
import trio
from burn_remote.server._fair import JOB_WEIGHT, SLICE, FairShare, Ticket


def backlogged(fair: FairShare, costs: dict[str, float], weights: dict[str, float], turns: int):
    """Every flow always has a turn waiting (it asks for the next as it finishes); one slot.
    Returns the order of turns and each flow's engine seconds after every turn."""
    held: dict[str, Ticket] = {}
    for key in costs:
        held[key] = fair.ask(key, "session" if weights[key] == 1 else "job", weights[key])
    order, seconds, history = [], dict.fromkeys(costs, 0.0), []
    for _ in range(turns):
        running = [k for k, t in held.items() if t.granted]
        assert len(running) == fair.slots, running  # every slot busy, the rest wait
        key = running[0]
        order.append(key)
        seconds[key] += costs[key]
        again = fair.finish(held[key], costs[key], more=True)
        assert again is not None
        held[key] = again
        history.append(dict(seconds))
    return order, history


def test_a_flood_gets_its_share_and_the_small_peer_runs_between_its_turns():
    fair = FairShare(slots=1)
    costs = {"flood": 0.040, "benign": 0.002}  # a 1024^2 matmul against a small step
    order, history = backlogged(fair, costs, {"flood": 1.0, "benign": 1.0}, 400)
    # never two flood turns in a row while the benign peer waits (FIFO of whole steps would
    # run the flood's 20 first)
    assert "flood,flood" not in ",".join(order)
    # the bound at every point: seconds differ by at most one turn
    worst = max(abs(h["flood"] - h["benign"]) for h in history)
    assert worst <= max(costs.values()) + 1e-9, worst
    assert order.count("benign") >= 15 * order.count("flood") - 20, order.count("flood")


def test_many_sessions_of_one_peer_share_one_flow():
    fair = FairShare(slots=1)
    tickets = [fair.ask("attacker", "session", 1.0) for _ in range(4)]
    victim = fair.ask("victim", "session", 1.0)
    assert tickets[0].granted and not victim.granted
    ran = {"attacker": 0.0, "victim": 0.0}
    pending = [*tickets[1:], victim]
    current = tickets[0]
    for _ in range(200):
        key = current.flow.key
        ran[key] += 0.005
        again = fair.finish(current, 0.005, more=True)
        pending.append(again)
        current = next(t for t in pending if t.granted)
        pending.remove(current)
    # four sessions buy the attacker no more than the victim's one
    assert abs(ran["attacker"] - ran["victim"]) <= 2 * 0.005 + 1e-9, ran


def test_a_job_runs_below_a_session_and_is_not_starved():
    fair = FairShare(slots=1)
    costs = {"session": 0.004, "job": 0.004}
    order, history = backlogged(fair, costs, {"session": 1.0, "job": JOB_WEIGHT}, 500)
    last = history[-1]
    # per weight, within the bound: the job gets JOB_WEIGHT of what the session gets
    gap = abs(last["session"] - last["job"] / JOB_WEIGHT)
    assert gap <= 0.004 / JOB_WEIGHT + 1e-9, last
    assert last["job"] > 0 and last["session"] > 3 * last["job"], last


def test_turns_start_at_once_when_free_and_cancel_gives_them_back():
    fair = FairShare(slots=2)
    a, b = fair.ask("a", "session", 1.0), fair.ask("b", "session", 1.0)
    assert a.granted and b.granted and fair.busy == 2
    woken = []
    c = fair.ask("c", "session", 1.0, lambda: woken.append("c"))
    d = fair.ask("d", "session", 1.0, lambda: woken.append("d"))
    assert not c.granted and not d.granted
    fair.cancel(c)  # a waiting turn leaves the queue
    fair.cancel(a)  # a granted turn unused: its slot goes to the next waiting
    assert d.granted and woken == ["d"] and not c.granted
    fair.finish(b, 0.001)
    fair.finish(d, 0.001)
    fair.cancel(d)  # twice (a cancelled wait, then the caller's cleanup): no second release
    fair.finish(b, 0.001)
    fair.cancel(c)
    assert fair.busy == 0
    shares = {f["flow"]: f for f in fair.shares()["flows"]}
    assert shares["b"]["turns"] == 1 and shares["a"]["seconds"] == 0.0
    assert shares["b"]["share"] == pytest.approx(0.5, abs=0.01)
    fair.forget("b")
    assert "b" not in {f["flow"] for f in fair.shares()["flows"]}


def test_an_idle_flow_banks_at_most_one_slice():
    fair = FairShare(slots=1)
    z = fair.ask("z", "session", 1.0)
    x = fair.ask("x", "session", 1.0)
    fair.finish(z, 0.0)
    fair.finish(x, 0.001)  # x ran once, then idles while z runs 200 turns alone
    z = fair.ask("z", "session", 1.0)
    for _ in range(200):
        z = fair.finish(z, 0.001, more=True)
    x = fair.ask("x", "session", 1.0)  # back: both now always want the engine
    order = []
    for _ in range(100):
        running = x if x.granted else z
        order.append(running.flow.key)
        again = fair.finish(running, 0.001, more=True)
        if running is x:
            x = again
        else:
            z = again
    first_z = order.index("z")
    assert first_z <= SLICE / 0.001 + 2, order  # a slice of credit, not 200 turns
    assert 40 <= order.count("x") <= 60, order  # then turn about


def simulated_share(weight: float, gap: float) -> float:
    """A session always backlogged (10 ms turns) beside a job that runs a 33 ms turn and
    then works gap seconds on its own before asking again; one slot, 20 simulated
    seconds. The job's engine seconds over the session's."""
    now = [0.0]
    fair = FairShare(slots=1, clock=lambda: now[0])
    session = fair.ask("s", "session", 1.0)
    job: Ticket | None = None
    job_asks = 0.0
    used = {"s": 0.0, "j": 0.0}
    running, ends = session, 0.010
    while now[0] < 20.0:
        if job is None and job_asks <= ends:
            now[0] = job_asks
            job = fair.ask("j", "job", weight)
        now[0] = ends
        key = running.flow.key
        cost = 0.010 if key == "s" else 0.033
        used[key] += cost
        if key == "s":
            session = fair.finish(running, cost, more=True)
        else:
            fair.finish(running, cost)
            job, job_asks = None, now[0] + gap
        running = session if session.granted else job  # type: ignore[assignment]
        assert running is not None and running.granted
        ends = now[0] + (0.010 if running.flow.key == "s" else 0.033)
    return used["j"] / used["s"]


def test_a_job_that_asks_turn_by_turn_still_gets_only_its_weight():
    # its own work between turns does not make every turn a fresh arrival with priority
    weighted = simulated_share(JOB_WEIGHT, gap=0.005)
    assert weighted == pytest.approx(JOB_WEIGHT, abs=0.05), weighted
    level = simulated_share(1.0, gap=0.005)  # the same job at a session's weight
    assert level > 2 * weighted, (level, weighted)


def test_a_blocked_thread_is_woken_by_a_finish_in_another():
    fair = FairShare(slots=1)
    first = fair.ask("a", "session", 1.0)
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(fair.run("b", "job", 0.5, len, "xyz")))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not got  # waits for the slot
    fair.finish(first, 0.001)
    thread.join(30)
    assert got == [3] and fair.busy == 0


def test_a_trio_waiter_is_woken_from_a_thread_and_cancelled_cleanly():
    fair = FairShare(slots=1)

    async def main() -> None:
        first = fair.ask("a", "session", 1.0)
        second = fair.ask("b", "session", 1.0)
        third = fair.ask("c", "session", 1.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, fair.finish, first, 0.001)
            with trio.fail_after(30):
                await fair.wait(second)
        assert second.granted
        with trio.move_on_after(0.05):
            await fair.wait(third)  # cancelled while waiting: it leaves the queue
        assert not third.granted and fair.shares()["flows"][2]["waiting"] == 0
        fair.finish(second, 0.001)
        assert fair.busy == 0

    trio.run(main)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="slots >= 1"):
        FairShare(slots=0)


def test_a_new_flow_starts_level_with_the_old_ones_not_at_zero():
    fair = FairShare(slots=1)
    old = fair.ask("old", "session", 1.0)
    for _ in range(100):  # 1 s of engine time, then it idles
        old = fair.finish(old, 0.010, more=True)
    fair.finish(old, 0.010)
    new = fair.ask("new", "session", 1.0)  # arrives while nobody is busy
    old = fair.ask("old", "session", 1.0)
    assert new.granted and not old.granted
    order = []
    for _ in range(40):  # both backlogged from here
        running = new if new.granted else old
        order.append(running.flow.key)
        again = fair.finish(running, 0.010, more=True)
        new, old = (again, old) if running is new else (new, again)
    # level (within a slice): turn about from the start, not 100 turns of the newcomer
    assert order[:4].count("old") >= 1, order
    assert 15 <= order.count("old") <= 25, order


def test_a_held_turn_gives_way_between_plan_steps_to_a_flow_behind_it():
    """A long run (a graph of many steps, a job's plan) holds one slot; a peer with less
    engine time asks: it gets the engine at the long run's next checkpoint, not at its end,
    and the long run goes on after it."""
    from burn_remote.engine import preempt
    from burn_remote.server._fair import YIELD_AFTER

    fair = FairShare(slots=1)
    warm = fair.ask("long", "session", 1.0)  # the long flow has used the engine before
    fair.finish(warm, 0.050)
    events: list[str] = []
    asked, release = threading.Event(), threading.Event()

    def long_run() -> None:
        check = preempt.current()
        assert check is not None  # fair.run installs the turn's checkpoint
        for step in range(40):
            if step == 1:
                asked.wait(10)
            events.append(f"long{step}")
            threading.Event().wait(YIELD_AFTER)  # a step's engine work
            check()
        release.set()

    runner = threading.Thread(target=fair.run, args=("long", "session", 1.0, long_run))
    runner.start()
    granted = threading.Event()
    small = fair.ask("small", "session", 1.0, granted.set)
    assert not small.granted  # the one slot is held
    asked.set()
    assert granted.wait(10), "the long run never gave way"
    events.append("small")
    fair.finish(small, 0.001)
    runner.join(10)
    assert release.is_set() and not runner.is_alive()
    at = events.index("small")
    assert 1 <= at <= 4, events  # at one of the long run's next checkpoints
    assert events[at + 1 :] == [f"long{i}" for i in range(at, 40)], events  # then it goes on
    assert fair.busy == 0
    flows = {f["flow"]: f for f in fair.shares()["flows"]}
    assert flows["long"]["turns"] >= 3  # warm-up, the part before giving way, the rest


def test_a_checkpoint_with_nobody_waiting_keeps_the_turn():
    from burn_remote.engine import preempt

    fair = FairShare(slots=1)
    seen = []

    def run() -> None:
        check = preempt.current()
        assert check is not None
        for _ in range(5):
            threading.Event().wait(0.002)
            check()
        seen.append(fair.busy)

    fair.run("only", "session", 1.0, run)
    assert seen == [1] and fair.busy == 0
    assert {f["flow"]: f["turns"] for f in fair.shares()["flows"]} == {"only": 1}
    assert preempt.current() is None  # the checkpoint ends with the turn


def test_engine_slots_are_one_on_the_cpu_and_two_on_a_gpu(monkeypatch):
    from burn_remote.server._fair import CPU_SLOTS, DEVICE_SLOTS, SLOTS_ENV, engine_slots

    monkeypatch.delenv(SLOTS_ENV, raising=False)
    assert (CPU_SLOTS, DEVICE_SLOTS) == (1, 2)
    assert engine_slots("cpu") == 1
    assert engine_slots("cuda:0") == engine_slots("opencl") == 2
    monkeypatch.setenv(SLOTS_ENV, "3")
    assert engine_slots("cpu") == engine_slots("cuda:1") == 3
