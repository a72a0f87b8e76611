"""Synthetic OmniInteract cases with canned judge replies, scored by the benchmark's code and by ours.

Pure data (standard library only): ``tools/parity/omniinteract_goldens.py`` runs the benchmark's
evaluation code on these cases and writes ``tests/omniinteract_goldens/official.json``;
``tests/bench/test_omniinteract_parity.py`` scores them with ``bench.omniinteract`` and compares.

A case: ``name``; ``subset`` (``1q1a``, ``1q1a_math``, ``1qna``); ``scene`` (``multi_turn``,
``nested``, ``1qna``); ``annotation`` (the dataset's JSON, any schema); ``transcript``
(``{chunks: [{text, timestamp, aligned_words?}]}``); ``replies``: the judge's raw reply text for
each question, keyed ``"<slot_id>:<stage>"`` (``early``, ``core``, ``partial``); ``config``: our
``EvaluationConfig`` fields that differ from the defaults. Slot ids are the benchmark's (see
``bench.omniinteract.slots``).

Together the cases cover every annotation schema (1Q1A list and ``items`` object, 1QnA
``answers`` and ``conversations``), every slot kind (realtime, proactive, unknown, nested outer
and inner, 1QnA steps, interrupted slots in each scene, Hard and Soft), word-level timing
(split chunks, trigger phrases, Chinese text), lenient reply parsing, non-default configurations
and a nested case the benchmark refuses.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CASES"]


def _chunk(start: Any, end: Any, text: str, words: list[tuple[str, float, float]] | None = None
           ) -> dict[str, Any]:
    out: dict[str, Any] = {"text": text, "timestamp": [start, end]}
    if words is not None:
        out["aligned_words"] = [{"text": t, "start": s, "end": e} for t, s, e in words]
    return out


def _words(text: str, start: float, step: float) -> list[tuple[str, float, float]]:
    """One word every ``step`` seconds from ``start``, each lasting ``0.8 * step``."""
    return [(w, round(start + i * step, 3), round(start + i * step + 0.8 * step, 3))
            for i, w in enumerate(text.split())]


def _row(q: Any, a: Any, question: str, answer: str, kind: str | None = "realtime",
         interrupted: Any = False) -> dict[str, Any]:
    out: dict[str, Any] = {"question_time": q, "question_text": question, "answer_time": a,
                           "answer_text": answer, "is_interrupted": interrupted}
    if kind is not None:
        out["question_type"] = kind
    return out


def _early(score: float = 1.0, flag: str = "Neutral") -> str:
    return json.dumps({"flag": flag, "score": score, "rationale": "an acknowledgement"})


_HALLUCINATION = json.dumps({"flag": "FP_Hallucination", "score": 0, "rationale": "answers too early"})


def _core(score: float, trigger: str = "", spoiler: bool = False) -> str:
    return json.dumps({"score": score, "trigger_phrase": trigger, "spoiler": spoiler,
                       "rationale": "compared"})


def _partial(score: float, hallucination: bool = False) -> str:
    return json.dumps({"score": score, "hallucination": hallucination, "rationale": "partial"})


def _case(name: str, subset: str, scene: str, annotation: Any, chunks: list[Any], replies: dict[str, str],
          **config: Any) -> dict[str, Any]:
    return {"name": name, "subset": subset, "scene": scene, "annotation": annotation,
            "transcript": {"text": " ".join(c.get("text", "") for c in chunks if isinstance(c, dict)),
                           "chunks": chunks},
            "replies": replies, "config": config}


def _multi_turn() -> list[dict[str, Any]]:
    return [
        _case("mt_basic", "1q1a", "multi_turn", [
            _row(2, 6, "What colour is the cup?", "The cup is red."),
            _row(20, 30, "Tell me when the kettle boils.", "The kettle is boiling now.", "proactive"),
        ], [
            _chunk(0.5, 1.5, "Hello there."),
            _chunk(3, 4, "Let me look."),
            _chunk(7, 9, "It is red."),
            _chunk(33, 36, "It is boiling."),
        ], {"1:early": _early(0.8), "1:core": _core(0.9), "2:core": _core(0.7)}),
        _case("mt_items_object", "1q1a", "multi_turn", {"items": [
            _row("00:00:01", "00:00:04.5", "How many apples?", "Three apples."),
            _row("00:00:10", "00:00:12", "Warn me if it falls.", "It fell.", "proactive"),
        ]}, [
            _chunk(4.5, 5.5, "Three."),
            _chunk(12.5, 13, "It fell!"),
        ], {"1:core": _core(1.0), "2:core": _core(0.6)}),
        _case("mt_interrupted_spoke", "1q1a", "multi_turn", [
            _row(0, 4, "Read me the kitchen rules.", "Wash hands. Keep knives away.", "realtime", True),
            _row(8, 11, "What is on the plate?", "A sandwich."),
        ], [
            _chunk(1, 2, "Rule one is to wash your hands."),
            _chunk(5, 9.5, "Rule two, keep knives away, and rule three..."),
            _chunk(11.5, 12, "A sandwich."),
        ], {"1:early": _HALLUCINATION, "1:partial": _partial(0.8), "2:core": _core(0.95)}),
        _case("mt_interrupted_poor", "1q1a", "multi_turn", [
            _row(0, 3, "Describe the room.", "A small kitchen with a window.", "realtime", "true"),
        ], [
            _chunk(1, 2, "Okay."),
            _chunk(3.5, 5, "There is a car outside."),
        ], {"1:early": _early(1.0), "1:partial": _partial(0.3, True)}),
        _case("mt_interrupted_silent", "1q1a", "multi_turn", [
            _row(0, 3, "Count the chairs.", "Four chairs.", "realtime", 1),
            _row(6, 9, "Is the door open?", "Yes, it is open."),
        ], [
            _chunk(9.5, 10, "Yes, open."),
        ], {"2:core": _core(0.9)}),
        _case("mt_next_question_before_answer", "1q1a", "multi_turn", [
            _row(0, 10, "Tell me when the timer rings.", "The timer rang.", "proactive"),
            _row(5, 8, "What is in the pot?", "Pasta."),
        ], [
            _chunk(3, 6.5, "I will tell you when it rings."),
            _chunk(7, 7.5, "Hmm."),
            _chunk(8.5, 9, "Pasta."),
        ], {"1:early": _early(0.9), "2:early": _early(0.5), "2:core": _core(1.0)}),
        _case("mt_same_question_time", "1q1a", "multi_turn", [
            _row(2, 6, "What is he holding, and tell me when he sits.", "He sits down.", "proactive"),
            _row(2, 4, "What is he holding?", "A book."),
        ], [
            _chunk(3, 3.5, "One moment."),
            _chunk(4.5, 5, "A book."),
            _chunk(6.5, 7, "He sat down."),
        ], {"2:early": _early(0.9), "2:core": _core(0.8)}),
        _case("mt_chunks_out_of_order", "1q1a", "multi_turn", [
            _row(0, 10, "What is the man cooking?", "He is frying eggs."),
        ], [
            _chunk(12, 14, "He is frying eggs."),
            _chunk(5, 6, "Looking now."),
            _chunk(11, 12, "Eggs, I think."),
            _chunk(3, 4, "Sure."),
        ], {"1:early": _early(1.0), "1:core": _core(0.85)}),
        _case("mt_decay_alpha_above_one", "1q1a", "multi_turn", [
            _row(0, 10, "What fruit is on the table?", "A banana."),
            _row(20, 30, "Tell me when the light turns green.", "It is green.", "proactive"),
        ], [
            _chunk(9, 9.5, "Let me see."),
            _chunk(19, 19.5, "A banana."),
            _chunk(25, 26, "Waiting for it."),
            _chunk(35, 36, "Green now."),
        ], {"1:early": _early(1.0), "1:core": _core(1.0), "2:early": _early(0.6), "2:core": _core(0.9)},
            decay_alpha=1.5, decay_gamma=2.0),
        _case("mt_word_split", "1q1a", "multi_turn", [
            _row(0, 5, "What is the woman pouring?", "She is pouring milk."),
        ], [
            _chunk(3, 9, "Let me check, she is pouring milk into the cup",
                   _words("Let me check, she is pouring milk into the cup", 3, 0.6)),
        ], {"1:early": _early(0.9), "1:core": _core(0.9, "pouring milk")}),
        _case("mt_word_trigger_in_second_chunk", "1q1a", "multi_turn", [
            _row(0, 4, "Which shelf holds the salt?", "The top shelf."),
        ], [
            _chunk(4.5, 6, "Well, I am looking", _words("Well, I am looking", 4.5, 0.35)),
            _chunk(7, 9, "it is on the top shelf", _words("it is on the top shelf", 7, 0.3)),
        ], {"1:core": _core(0.8, "\u201ctop shelf\u201d")}),
        _case("mt_word_text_mismatch", "1q1a", "multi_turn", [
            _row(0, 3, "What is the cat doing?", "It is sleeping."),
        ], [
            _chunk(2, 6, "Hmm, the cat is sleeping.",
                   [("Hmm", 2.0, 2.4), ("the", 2.6, 2.8), ("cat", 3.2, 3.5), ("is", 3.6, 3.7),
                    ("sleeping", 3.8, 4.4)]),
            _chunk(7, 8, "Still, sleeping!", [("Still", 7.0, 7.4), ("sleeping", 7.5, 8.0)]),
        ], {"1:early": _early(0.7), "1:core": _core(0.9, "Still, sleeping")}),
        _case("mt_straddle_without_words", "1q1a", "multi_turn", [
            _row(0, 5, "What is written on the board?", "Hello world."),
        ], [
            _chunk(4, 7, "It says hello world."),
        ], {"1:early": _early(0.4)}),
        _case("mt_chinese_words", "1q1a", "multi_turn", [
            _row(0, 5, "\u676f\u5b50\u662f\u4ec0\u4e48\u989c\u8272?", "\u7ea2\u8272\u3002"),
        ], [
            _chunk(4, 7, "\u6211\u770b\u770b\u662f\u7ea2\u8272",
                   [("\u6211", 4.0, 4.3), ("\u770b\u770b", 4.4, 4.9), ("\u662f", 5.2, 5.5),
                    ("\u7ea2\u8272", 5.8, 6.4)]),
        ], {"1:early": _early(1.0), "1:core": _core(1.0, "\u7ea2\u8272")}),
        _case("mt_lenient_replies", "1q1a", "multi_turn", [
            _row(0, 4, "What is the dog doing?", "Running.", "realtime"),
            _row(10, 14, "What colour is the ball?", "Blue.", "realtime"),
            _row(20, 24, "Tell me when it stops.", "It stopped.", "proactive"),
            _row(30, 34, "Who is at the door?", "The postman.", "realtime"),
            _row(40, 44, "How many birds?", "Two birds.", "realtime"),
        ], [
            _chunk(1, 2, "Right."), _chunk(5, 6, "Running."),
            _chunk(11, 12, "Hmm."), _chunk(15, 16, "Blue."),
            _chunk(21, 22, "Okay."), _chunk(25, 26, "It stopped."),
            _chunk(31, 32, "Oh."), _chunk(35, 36, "The postman."),
            _chunk(41, 42, "Let me count."), _chunk(45, 46, "Two."),
        ], {
            "1:early": 'Verdict: {"flag": "neutral", "score": "0.9"} (fine)',
            "1:core": "Sure. Score: 0.75 out of 1",
            "2:early": "This is Neutral, a plain acknowledgement.",
            "2:core": '{"score": 1.7, "trigger_phrase": "Blue", "spoiler": "yes"}',
            "3:early": '{"flag": "Other", "score": 0.9}',
            "3:core": "I cannot tell.",
            "4:early": '{} then {"flag": "FP-Hallucination"}',
            "4:core": '{"score": null, "rationale": "no number"} 0.6',
            "5:early": '{"flag": "Neutral", "score": "high"}',
            "5:core": '{"trigger_phrase": "Two"}',
        }),
        _case("mt_unmatched_not_counted", "1q1a", "multi_turn", [
            _row(5, 8, "What is the boy eating?", "An apple."),
        ], [
            _chunk(1, 2, "Hi!"),
            _chunk(8.5, 9, "An apple."),
            _chunk(2, 3, "Nice day."),
        ], {"1:core": _core(0.9)}, count_unmatched_as_fp=False),
        _case("mt_custom_weights", "1q1a", "multi_turn", [
            _row(0, 4, "What time is on the clock?", "Ten past three."),
            _row(10, 12, "Which hand moved?", "The minute hand."),
        ], [
            _chunk(2, 3, "Looking at the clock."),
            _chunk(5, 6, "It is ten past three."),
            _chunk(13, 14, "The minute hand, I think."),
        ], {"1:early": _early(1.0), "1:core": _core(0.65), "2:core": _core(0.55)},
            w_ack=0.3, core_quality_threshold=0.6),
        _case("mt_empty_transcript", "1q1a", "multi_turn", [
            _row(1, 3, "Is it raining?", "Yes."),
            _row(5, 7, "Tell me when it stops.", "It stopped.", "proactive"),
        ], [], {}),
        _case("mt_odd_timestamps", "1q1a", "multi_turn", [
            _row(0, 5, "What does the sign say?", "Stop."),
        ], [
            _chunk(7, 6, "It says stop."),
            _chunk("00:02", "00:03", "Reading it."),
            {"text": "no times"},
            "not a chunk",
            _chunk(1, "soon", "unreadable end"),
            _chunk(8, 9, "Stop!"),
        ], {"1:early": _early(0.5), "1:core": _core(0.8, "stop")}),
        _case("mt_short_tail", "1q1a", "multi_turn", [
            _row(0, 2, "What is she reading?", "A newspaper."),
        ], [
            _chunk(3, 9, "A newspaper, with a long story about the weather that goes on."),
            _chunk(10, 11, "Anything else?"),
        ], {"1:core": _core(0.9)}, last_slot_tail_s=5.0),
        _case("mt_unknown_type", "1q1a", "multi_turn", [
            _row(0, 3, "What is that noise?", "A phone ringing.", None),
            _row(6, 9, "Tell me when it stops ringing.", "It stopped.", "proactive"),
        ], [
            _chunk(3.5, 4.5, "A phone."),
            _chunk(9.5, 10, "Stopped."),
        ], {"1:core": _core(0.8), "2:core": _core(1.0)}),
        _case("mt_partial_not_judged", "1q1a", "multi_turn", [
            _row(0, 3, "List the ingredients.", "Flour, eggs, milk.", "realtime", True),
        ], [
            _chunk(3.5, 70, "Flour, eggs, and milk, and then..."),
        ], {}, evaluate_interrupted_outputs=False, partial_quality_threshold=0.7),
    ]


def _math() -> list[dict[str, Any]]:
    return [
        _case("math_answered", "1q1a_math", "multi_turn", [
            _row("00:00:00.5", "00:00:03", "What is two plus two?", "Four."),
            _row("00:00:05", "00:00:08", "And times three?", "Twelve."),
        ], [
            _chunk(1, 2, "Let me think."),
            _chunk(3.2, 4, "Four."),
            _chunk(9, 10, "Twelve."),
        ], {"1:early": _early(0.9), "1:core": _core(1.0), "2:core": _core(1.0)}),
        _case("math_guessed_early", "1q1a_math", "multi_turn", [
            _row(0, 6, "Solve x plus three equals five.", "x equals two."),
        ], [
            _chunk(1, 2, "x is two."),
            _chunk(20, 22, "So x equals two."),
        ], {"1:early": _HALLUCINATION, "1:core": _core(0.9)}),
    ]


def _nested() -> list[dict[str, Any]]:
    def pair_rows(t: float, outer: str, inner: str) -> list[dict[str, Any]]:
        return [_row(t, t + 20, f"Tell me when {outer}.", f"Now {outer}.", "proactive"),
                _row(t + 5, t + 8, f"What is {inner}?", f"It is {inner}.", "realtime")]

    def pooled(name: str, t_inner: float, s_inner: float, t_outer: float, s_outer: float) -> dict[str, Any]:
        return _case(name, "1q1a", "nested", pair_rows(0, "the bus comes", "the sign") + pair_rows(
            40, "the rain stops", "the car"), [
            _chunk(t_inner, t_inner + 1, "It is the sign."),
            _chunk(t_outer, t_outer + 1, "Now the bus comes."),
            _chunk(48.5, 49.5, "It is the car."),
            _chunk(61, 62, "Now the rain stops."),
        ], {"2:core": _core(s_inner), "1:core": _core(s_outer), "4:core": _core(0.9), "3:core": _core(0.8)})

    return [
        _case("nested_basic", "1q1a", "nested", pair_rows(0, "the train arrives", "the clock"), [
            _chunk(2, 3, "Okay, I will watch."),
            _chunk(8.5, 9.5, "It is the clock."),
            _chunk(21, 22, "Now the train arrives."),
        ], {"1:early": _early(0.8), "2:core": _core(0.9), "1:core": _core(0.85)}),
        _case("nested_late_and_weak", "1q1a", "nested", pair_rows(0, "the oven beeps", "the dish"), [
            _chunk(8.5, 9, "It is the dish."),
            _chunk(55, 56, "Now the oven beeps."),
        ], {"2:core": _core(0.45), "1:core": _core(1.0)}),
        _case("nested_outer_anchor_first", "1q1a", "nested", pair_rows(0, "the baby wakes", "the toy"), [
            _chunk(9, 16, "hmm it is the toy", _words("hmm it is the toy", 12, 1.0)),
            _chunk(20.5, 22, "Now the baby wakes", _words("Now the baby wakes", 11, 0.5)),
        ], {"2:core": _core(0.9, "the toy"), "1:core": _core(0.9, "Now")}),
        _case("nested_outer_silent", "1q1a", "nested", pair_rows(0, "the kettle clicks", "the mug"), [
            _chunk(9, 9.5, "Now the kettle clicks."),
            _chunk(9.6, 10, "It is the mug."),
        ], {"2:core": _core(0.9)}),
        _case("nested_row_left_out", "1q1a", "nested", [
            _row(0, 20, "Tell me when the bell rings.", "The bell rang.", "proactive"),
            _row(1, 25, "Tell me when the door shuts.", "It shut.", "proactive"),
            _row(3, 6, "What is on the wall?", "A painting."),
            _row(30, 40, "Tell me when the dog barks.", "It barked.", "proactive"),
            _row(32, 35, "What colour is the dog?", "Brown."),
        ], [
            _chunk(6.5, 7, "A painting."),
            _chunk(21, 22, "The bell rang."),
            _chunk(24, 26, "The door shut too."),
            _chunk(35.5, 36, "Brown."),
            _chunk(41, 42, "It barked."),
        ], {"2:core": _core(0.9), "1:core": _core(0.8), "4:core": _core(1.0), "3:core": _core(0.7)}),
        _case("nested_same_start_tie", "1q1a", "nested", [
            _row(0, 6, "Tell me when the tap is off.", "The tap is off.", "proactive"),
            _row(3, 5, "What is in the sink?", "Plates."),
            _row(3, 20, "Tell me when the plates are dry.", "They are dry.", "proactive"),
            _row(4, 10, "How many plates?", "Five."),
        ], [
            _chunk(3.5, 3.8, "Plates."),
            _chunk(10.5, 11, "Five."),
            _chunk(21, 22, "They are dry."),
        ], {"3:early": _early(0.5), "4:core": _core(0.9), "3:core": _core(0.9)}),
        _case("nested_unpaired_rejected", "1q1a", "nested", [
            _row(0, 10, "Tell me when it boils.", "It boils.", "proactive"),
            _row(2, 5, "What is in the pot?", "Water."),
            _row(20, 30, "Tell me when it cools.", "It is cool.", "proactive"),
        ], [
            _chunk(6, 7, "Water."),
        ], {}),
        pooled("nested_pooled_a", 8.5, 0.9, 21, 0.8),
        pooled("nested_pooled_b", 9.5, 0.7, 30, 1.0),
        pooled("nested_pooled_c", 10, 0.3, 22, 0.9),
        _case("nested_inner_interrupted", "1q1a", "nested", [
            _row(0, 20, "Tell me when the film ends.", "The film ended.", "proactive"),
            _row(4, 7, "Who is the actor?", "A tall man.", "realtime", True),
        ], [
            _chunk(7.5, 22, "A tall man with a hat, who also..."),
        ], {"2:partial": _partial(0.6)}),
        _case("nested_order_by_trigger", "1q1a", "nested", pair_rows(0, "the lift opens", "the floor"), [
            _chunk(8.5, 12, "Floor, hmm, it is the floor", _words("Floor, hmm, it is the floor", 8.5, 0.5)),
            _chunk(20.5, 23, "Now the lift opens", _words("Now the lift opens", 20.5, 0.5)),
        ], {"2:core": _core(0.9, "it is the floor"), "1:core": _core(0.9, "Now")}),
    ]


def _qna() -> list[dict[str, Any]]:
    return [
        _case("qna_answers", "1qna", "1qna", {
            "question_time": 1, "question_text": "Guide me through making tea.",
            "inferred_knowledge": "The user is making tea.",
            "answers": [
                {"answer_time": 5, "answer_text": "Boil the water.", "label": "Proactive"},
                {"answer_time": 12, "answer_text": "Put the tea bag in the cup."},
                {"answer_time": 20, "answer_text": "Pour the water.", "label": "  "},
            ],
        }, [
            _chunk(2, 3, "Sure, let's start."),
            _chunk(6, 7, "Boil the water first."),
            _chunk(10, 11, "Then add the bag and pour."),
            _chunk(13, 15, "Put the tea bag in."),
            _chunk(21, 40, "Now pour the water slowly and wait for a long while."),
        ], {"1:early": _early(0.9), "1:core": _core(0.9), "2:core": _core(0.8, spoiler=False),
            "3:core": _core(0.7)}),
        _case("qna_answers_interrupted", "1qna", "1qna", {
            "question_time": "00:00", "question_text": "Help me fix the bike.",
            "answers": [
                {"answer_time": "00:04", "answer_text": "Flip the bike over.", "label": "step"},
                {"answer_time": "00:09", "answer_text": "Remove the wheel.", "is_interrupted": True},
                {"answer_time": "00:15", "answer_text": "Patch the tube.", "interrupted": "yes"},
            ],
        }, [
            _chunk(1, 2, "Okay, first flip it over and remove the wheel."),
            _chunk(9.5, 16, "Remove the wheel by loosening the nuts and then..."),
            _chunk(17, 18, "Patch it."),
        ], {"1:early": _HALLUCINATION, "2:partial": _partial(0.9), "3:partial": _partial(0.2)}),
        _case("qna_conversations", "1qna", "1qna", {
            "inferred_knowledge": "The user is assembling a shelf.",
            "conversations": [
                {"from": "user", "timestamp": "00:01", "value": "How do I build this shelf?"},
                {"from": "assistant", "timestamp": "00:06", "value": "Lay out the panels.", "label": "step"},
                {"from": "assistant", "timestamp": "00:14", "value": "Screw in the sides.",
                 "interrupted": True},
                {"from": "assistant", "timestamp": 22, "value": "Add the shelves.", "label": "Reminder"},
            ],
        }, [
            _chunk(3, 4, "Let's begin."),
            _chunk(6.5, 8, "Lay out all the panels."),
            _chunk(14.5, 15, "Screw..."),
            _chunk(23, 25, "Add the shelves now."),
        ], {"1:early": _early(1.0), "1:core": _core(1.0), "2:partial": _partial(0.4), "3:core": _core(0.9)}),
        _case("qna_question_after_first_step", "1qna", "1qna", {
            "question_time": 8, "question_text": "What next?",
            "answers": [
                {"answer_time": 3, "answer_text": "Open the box."},
                {"answer_time": 6, "answer_text": "Take out the parts."},
                {"answer_time": 6, "answer_text": "Read the manual."},
            ],
        }, [
            _chunk(6.5, 7, "Take out the parts."),
            _chunk(8.5, 9, "Open the box."),
            _chunk(12, 13, "Read the manual."),
        ], {"3:core": _core(0.8), "1:early": _early(0.5)}),
        _case("qna_conversation_words", "1qna", "1qna", {
            "inferred_knowledge": "The user is washing a car.",
            "conversations": [
                {"from": "user", "timestamp": 0, "value": "Walk me through washing the car."},
                {"from": "assistant", "timestamp": 4, "value": "Rinse the car."},
                {"from": "assistant", "timestamp": 10, "value": "Apply the soap."},
            ],
        }, [
            _chunk(2, 6, "Okay so rinse the car now", _words("Okay so rinse the car now", 2, 0.6)),
            _chunk(9, 12, "and apply the soap", _words("and apply the soap", 9, 0.7)),
        ], {"1:early": _early(0.7), "1:core": _core(0.9, "rinse the car"), "2:core": _core(0.8, "apply")}),
    ]


CASES: list[dict[str, Any]] = _multi_turn() + _math() + _nested() + _qna()
