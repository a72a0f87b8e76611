"""The reliability suite: attacks against a real server, and what they did to it.

``python -m bench.reliability`` runs each attack of ``bench.reliability.attacks`` (``/v1/realtime``)
and ``bench.reliability.routes`` (the HTTP batch routes, the speech socket, both video routes, the
MAP dialect and its waiting room, a model worker) against a fresh ``duplex serve`` process while a
bystander session, in a process of its own (``bench.reliability.bystander``), keeps talking to the
same server, and reports, per attack, the bystander's heartbeat latency (p50/p99/max) and
``/health`` latency (p99/max, and the status words it read), the server's resident memory before,
at its peak and ``settle_s`` after, whether it survived, what the attack was answered, and a
verdict against the attack's targets (``attacks.judge``): heartbeat p99 under 250 ms, ``/health``
p99 under 500 ms with every request answered, memory back within 200 MB, another session's first
audio under 3 s, and the attack's own expected outcome (errors with codes, no growth of
``/metrics``, no secret in the log, partial headers dropped, slots that come back, departed
requests cancelled within a second, a hung worker reported within its step deadline). The table
goes to stdout, everything to ``--json``; ``--plot`` draws each attack's memory over time.
"""
