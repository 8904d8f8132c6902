"""``SimPDEngine``: prefill/decode disaggregation simulated (``kvscope simulate --pd 1P1D``).

Each instance is a simulated ``Engine`` (``kvscope.sim.build.simulated_engine``: the engine's own scheduler,
KV cache manager and block pool, its own prefix cache), and all of them run on ONE virtual clock. The
instances run concurrently in virtual time, in an event-ordered loop (``step``):

1. every idle instance with work starts a step at the clock's time ``now``; the step is computed at once
   (its worker moves the clock by the predicted time), the instance is busy until that end, and the clock
   is set back to ``now``. Computing a step at its start is the same as over its duration because nothing
   reads a busy instance's state: a request queued on it meanwhile waits for its next step, as it would
   (the one exception: a hand-over reads which of the prompt's blocks a busy producer still caches);
2. the clock moves to the earliest event: a step's end, a transfer's end, or (given the workload's arrival
   times) the next arrival, so a request never arrives late to an idle prefill instance;
3. at that time, in instance order (deterministic): the ended steps' requests are routed as the real
   router routes them (``kvscope.pd.router.Router._route``: a prefill done with ``max_tokens=1`` is handed
   over, others finish); transfers whose bytes are in land on their consumer if it is idle (else at the
   end of its step); hand-overs waiting start on the least loaded idle consumer.

A hand-over (``SimInstance.reserve``) moves only the full prompt blocks the consumer lacks. It takes
``bytes / bandwidth + latency`` of virtual time on its producer -> consumer link (``SimLink``), which carries
one transfer's bytes at a time; the consumer keeps decoding meanwhile. A consumer without the free blocks
for a transfer makes it wait (vLLM's consumers wait to allocate; the real router refuses at once). The
records, events and ``meta["pd"]`` are a real P/D run's (``kvscope.pd.recorder.PDRecorder``), so summary,
report and compare read it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from kvscope.engine.engine import Engine
from kvscope.engine.request import Request, RequestOutput
from kvscope.pd.config import KV_CONSUMER, PDLayout
from kvscope.pd.router import Router
from kvscope.pd.routes import PDRequest, TransferRecord
from kvscope.pd.sim_instance import Reservation, SimInstance, TransferRefused
from kvscope.telemetry.records import RequestEvent, StepRecord
from kvscope.utils.clock import VirtualClock

TRANSPORT = "simulated"
KV_BANDWIDTH_GB_PER_S = 25.0  # a 200 Gb/s RDMA NIC between two machines (--kv-bandwidth's help says so)
KV_LATENCY_S = 0.0001  # 100 us per transfer: setup and completion notice (--kv-latency's help says so)


@dataclass(frozen=True, slots=True)
class SimLink:
    """The simulated KV transfer between two instances: ``bandwidth_gb_per_s`` (10**9 bytes a second) and
    a fixed ``latency_s`` per transfer. It stands where a real engine's ``kv_transfer_config`` stands."""

    bandwidth_gb_per_s: float = KV_BANDWIDTH_GB_PER_S
    latency_s: float = KV_LATENCY_S
    transport = TRANSPORT

    def wire_ns(self, num_bytes: int) -> int:
        """How long the link is busy with ``num_bytes``."""
        return round(num_bytes / (self.bandwidth_gb_per_s * 1e9) * 1e9)

    def to_json(self) -> dict[str, Any]:
        return {"kv_connector": TRANSPORT, "kv_bandwidth_gb_per_s": self.bandwidth_gb_per_s,
                "kv_latency_s": self.latency_s}


@dataclass(slots=True)
class Flight:
    """A transfer in flight: its bytes are in at ``end_ns``."""

    end_ns: int
    req: PDRequest
    src: SimInstance
    dst: SimInstance
    res: Reservation


class SimPDEngine(Router[SimInstance, SimLink]):
    """The router (``kvscope.pd.router.Router``: ``Engine``'s request API) over simulated instances on one
    ``VirtualClock``, with this module's event loop as its ``step``.

    ``build(name, clock)`` makes each instance's simulated engine; ``arrivals_s``: the workload's arrival
    times in seconds from now, nondecreasing, read lazily (optional: without them, a request that arrives
    while every instance is busy is seen at the next event)."""

    clock: VirtualClock  # the shared clock, which the event loop sets to each event's time (``_set_clock``)

    def __init__(self, build: Callable[[str, VirtualClock], Engine], pd: str | PDLayout = "1P1D",
                 link: SimLink | None = None, *, clock: VirtualClock | None = None,
                 arrivals_s: Iterable[float] | None = None) -> None:
        layout, clock = PDLayout.parse(pd), clock or VirtualClock()
        instances = {name: SimInstance(name, role, build(name, clock)) for name, role in layout.names()}
        first = next(iter(instances.values())).engine
        super().__init__(layout, link or SimLink(), instances, clock=clock, config=first.config,
                         model_name=first.model_name, spec=first.spec, eos_token_ids=first.eos_token_ids,
                         max_model_len=first.max_model_len, tokenizer=first.tokenizer)
        self.flights: list[Flight] = []
        self.link_free_ns: dict[tuple[str, str], int] = {}
        self.results: dict[str, tuple[list[RequestOutput], list[str]]] = {}  # a busy instance's step, until its end
        self.stalled: set[str] = set()  # instances whose last step took no time (nothing to schedule)
        self.t0_ns = clock.now_ns()
        self.arrivals = iter(arrivals_s or ())  # nondecreasing, read as the clock passes them
        self.next_arrival_ns: int | None = self.t0_ns
        for name, inst in instances.items():
            if inst.role == KV_CONSUMER and inst.engine.recorder is not None:
                inst.engine.recorder.subscribe(partial(self._publish, name))

    def _publish(self, name: str, item: StepRecord | RequestEvent) -> None:
        """A decode instance's record or event, as the run sees it live: a request is queued at its arrival
        (the exact summary of a run longer than the recorder's window counts TTFT from there, as the
        snapshot does)."""
        if isinstance(item, RequestEvent) and item.kind == "queued" and item.request_id in self.requests:
            item = replace(item, t_ns=self.requests[item.request_id].arrival_ns)
        self.recorder.publish(name, [item])

    def _dispatch(self, inst: SimInstance, request: Request) -> None:
        """Queued on the prefill instance at once (``max_tokens=1``)."""
        inst.add(request, max_tokens=1)

    def abort(self, request_id: str) -> bool:
        for f in [f for f in self.flights if f.req.request_id == request_id]:
            self.flights.remove(f)
            f.dst.release(f.res, f.src)
        return super().abort(request_id)

    # ---- the event loop ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Start a step on every idle instance with work, move the clock to the next event and take every
        event due then; returns the requests that finished."""
        now = self.clock.now_ns()
        for inst in self.instances.values():
            if inst.busy_until_ns is None and inst.name not in self.stalled and inst.engine.has_unfinished_requests():
                self._start(inst, now)
        t = self._next_event_ns(now)
        if t is not None:
            if t > now:
                self.stalled.clear()
            self._set_clock(t)
            for inst in self.instances.values():
                if inst.busy_until_ns is not None and inst.busy_until_ns <= t:
                    self._end(inst, t)
        self._land(self.clock.now_ns())
        self._hand_over_ready()
        out, self.outbox = self.outbox, []
        busy = self.flights or any(i.busy_until_ns is not None for i in self.instances.values())
        if t is None and self.requests and not out and not busy:
            raise RuntimeError(f"the simulated P/D engine is stuck with {len(self.requests)} requests: no "
                               "instance can schedule them (a pool too small for one request?)")
        return out

    def _set_clock(self, t_ns: int) -> None:
        """The shared clock reads the time of the event being handled (``step`` sets it back after a step
        computed ahead: see the module doc)."""
        self.clock.t_ns = t_ns

    def _start(self, inst: SimInstance, now: int) -> None:
        self.results[inst.name] = inst.step()
        end = self.clock.now_ns()
        self._set_clock(now)
        inst.busy_until_ns = end
        if end == now:  # it scheduled nothing: not started again until something else happens
            self.stalled.add(inst.name)
            self._end(inst, now)

    def _next_event_ns(self, now: int) -> int | None:
        while self.next_arrival_ns is not None and self.next_arrival_ns <= now:
            t = next(self.arrivals, None)
            self.next_arrival_ns = None if t is None else self.t0_ns + round(t * 1e9)
        times = [i.busy_until_ns for i in self.instances.values() if i.busy_until_ns is not None]
        times += [max(f.end_ns, f.dst.busy_until_ns or 0) for f in self.flights]  # lands on an idle consumer
        if self.next_arrival_ns is not None and (times or self.requests):  # else the run sleeps until it
            times.append(self.next_arrival_ns)
        return min(times) if times else None

    def _end(self, inst: SimInstance, t: int) -> None:
        finished, first = self.results.pop(inst.name, ([], []))
        inst.busy_until_ns = None
        for rid in first:
            if rid in self.requests:
                self.requests[rid].timeline[f"{inst.role}_first_token_ns"] = t
        for out in finished:
            self._route(inst.name, inst.role, out, t)

    def _land(self, t: int) -> None:
        """Transfers whose bytes are in, on an idle consumer: the request is queued there."""
        for f in sorted(self.flights, key=lambda f: f.end_ns):
            if f.end_ns <= t and f.dst.busy_until_ns is None:
                self.flights.remove(f)
                f.dst.land(f.req.request, f.res, f.src)
                f.req.timeline["decode_queued_ns"] = t

    def _hand_over_ready(self) -> None:
        """Each waiting hand-over starts on the least loaded idle consumer (as the real router picks)."""
        later = []
        for req in self.handovers:
            if req.request_id not in self.requests:
                continue
            idle = [i for i in self.instances.values() if i.role == KV_CONSUMER and i.busy_until_ns is None]
            if not (idle and self._transfer(req, min(idle, key=lambda i: self.load[i.name]))):
                later.append(req)
        self.handovers = later

    def _transfer(self, req: PDRequest, dst: SimInstance) -> bool:
        """Start the request's transfer to ``dst``; ``False`` if it must wait for free blocks there (as vLLM's
        consumer waits to allocate; kvscope's real router refuses at once). A prompt that needs more blocks
        than ``dst`` has at all fails, as a refused transfer does."""
        src, now = self.instances[req.prefill], self.clock.now_ns()
        try:
            res = dst.reserve(req.prompt_ids, src)
        except TransferRefused as exc:
            if dst.pool.num_blocks > len(req.prompt_ids) // dst.pool.block_size:
                return False
            error = f"KV transfer {src.name} -> {dst.name} failed: {exc}"
            self.transfers.append(TransferRecord(req.request_id, src.name, dst.name, TRANSPORT, 0, 0, 0, now, now,
                                                 False, error))
            self.outbox.append(self._fail(req, error))
            return True
        link, num_bytes = (src.name, dst.name), len(res.new) * src.engine.runner.kv_bytes_per_block
        start = max(now, self.link_free_ns.get(link, now))
        wire = self.kv_transfer_config.wire_ns(num_bytes)
        self.link_free_ns[link] = start + wire
        end = start + wire + round(self.kv_transfer_config.latency_s * 1e9)
        req.decode = dst.name
        self.load[dst.name] += 1
        self.transfers.append(TransferRecord(req.request_id, src.name, dst.name, TRANSPORT, len(res.new),
                                             len(res.held), num_bytes, start, end))
        req.timeline.update(transfer_start_ns=start, transfer_end_ns=end)
        self.flights.append(Flight(end, req, src, dst, res))
        return True
