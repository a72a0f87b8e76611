"""``duplex talk``'s progress line in a log (stderr not a terminal): a new line only when it
changed and at most once a second, instead of a redraw per update."""

from __future__ import annotations

import pytest

from clients.talk import _Progress


def test_progress_in_a_log_prints_changed_lines_at_most_once_a_second(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter([0.0, 0.1, 0.2, 1.5, 1.6, 3.0])
    monkeypatch.setattr("clients.talk.time.monotonic", lambda: next(clock))
    progress = _Progress(total_s=2.0, quiet=False)
    assert not progress.tty  # captured stderr is not a terminal
    for sent in (0.1, 0.2, 0.3, 0.4, 0.4, 0.4):  # the last two repeat the line shown at 1.5
        progress.sent_s = sent
        progress.show()
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.splitlines() == [
        "sent   0.1/2.0 s | reply audio   0.0 s | responses 0",
        "sent   0.4/2.0 s | reply audio   0.0 s | responses 0",
    ]


def test_quiet_progress_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress = _Progress(total_s=None, quiet=True)
    progress.show()
    assert capsys.readouterr().err == ""


def test_a_model_staying_quiet_is_no_activity_to_wait_for() -> None:
    from clients.talk import _Activity
    from duplex.protocol.ext.events import ResponseListen
    from duplex.protocol.realtime.events import ResponseCreated
    from duplex.protocol.realtime.responses import Response

    activity = _Activity()
    activity.saw(ResponseListen(event_id="e1", epoch=0))  # a unit model's quiet unit (padding too)
    assert activity.events == 0
    activity.saw(ResponseCreated(event_id="e2", response=Response(id="resp_1", status="in_progress")))
    assert activity.events == 1
