"""The conversation of one session: ordered items, as the client and the model see them.

Sans-IO and bounded twice: at most ``max_items`` items and ``max_bytes`` bytes (each
item sized by ``sizes.item_size``); past either bound the oldest items leave first,
counted in ``evicted``. One item larger than ``max_bytes`` on its own is refused
(``item_too_large``) with nothing changed. Audio bytes are never kept here: an item
is stored without the ``audio`` of its parts (user audio items keep their transcript,
assistant items their transcript as far as it was heard; the playback ledger
rewrites them), so the bound counts what is really held. A client-supplied item id
is kept; ``previous_item_id="root"`` inserts at the front.

Errors are ``ProtocolError``s with the wire codes: ``item_not_found``,
``invalid_item`` (duplicate id), ``item_too_large``, ``invalid_function_call_output``.
"""

from __future__ import annotations

import msgspec

from duplex.engine.sizes import item_size
from duplex.protocol.errors import ProtocolError
from duplex.protocol.ids import new_item_id
from duplex.protocol.realtime.items import (
    AudioPart,
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudioPart,
    InputTextPart,
    MessageItem,
    OutputAudioPart,
    OutputTextPart,
)

__all__ = ["Conversation"]


class Conversation:
    """Ordered, bounded item store (see the module docstring)."""

    def __init__(self, max_items: int = 1024, max_bytes: int = 16 * 1024 * 1024) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: dict[str, ConversationItem] = {}
        self._sizes: dict[str, int] = {}
        self._order: list[str] = []
        self._bytes = 0
        self.evicted = 0

    @property
    def size_bytes(self) -> int:
        """Bytes the items hold (``sizes.item_size`` of each)."""
        return self._bytes

    def clear(self) -> None:
        """Forget every item (the session closed: its memory goes at once)."""
        self._items.clear()
        self._sizes.clear()
        self._order.clear()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    @property
    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def ids(self) -> list[str]:
        return list(self._order)

    def get(self, item_id: str, *, param: str = "item_id") -> ConversationItem:
        try:
            return self._items[item_id]
        except KeyError:
            raise ProtocolError("item_not_found", f"no item with id {item_id!r}", param=param) from None

    def add(
        self, item: ConversationItem, previous_item_id: str | None = None
    ) -> tuple[ConversationItem, str | None]:
        """Insert ``item`` (an id is assigned when it has none); returns it and its predecessor id."""
        if getattr(item, "id", None) is None:
            item = msgspec.structs.replace(item, id=new_item_id())
        item_id = item.id  # type: ignore[union-attr]
        if item_id in self._items:
            raise ProtocolError(
                "invalid_item", f"an item with id {item_id!r} already exists", param="item.id"
            )
        if previous_item_id is None:
            index = len(self._order)
        elif previous_item_id == "root":
            index = 0
        elif previous_item_id in self._items:
            index = self._order.index(previous_item_id) + 1
        else:
            raise ProtocolError(
                "item_not_found", f"previous_item_id {previous_item_id!r} not found", param="previous_item_id"
            )
        if isinstance(item, FunctionCallOutputItem):
            self._check_call_output(item)
        item = _without_audio(item)
        size = item_size(item)
        if size > self.max_bytes:
            raise ProtocolError(
                "item_too_large",
                f"the item holds {size} bytes; a conversation keeps at most {self.max_bytes}",
                param="item",
            )
        self._order.insert(index, item_id)
        self._items[item_id] = item
        self._sizes[item_id] = size
        self._bytes += size
        while len(self._order) > self.max_items or self._bytes > self.max_bytes:
            self._forget(self._order.pop(0))
            self.evicted += 1
        previous = self._order[index - 1] if index > 0 and item_id in self._items else None
        return item, previous

    def _check_call_output(self, item: FunctionCallOutputItem) -> None:
        calls = [
            i for i in self._items.values() if isinstance(i, FunctionCallItem) and i.call_id == item.call_id
        ]
        if not calls:
            raise ProtocolError(
                "invalid_function_call_output",
                f"no function_call item with call_id {item.call_id!r}",
                param="item.call_id",
            )
        if any(
            isinstance(i, FunctionCallOutputItem) and i.call_id == item.call_id for i in self._items.values()
        ):
            raise ProtocolError(
                "invalid_function_call_output",
                f"call_id {item.call_id!r} already has an output",
                param="item.call_id",
            )

    def replace(self, item: ConversationItem) -> None:
        """Store a new version of an existing item (same id); a no-op if it was deleted.

        Only the server replaces items (a transcript, the heard part of a reply): the new
        version is sized again, and the oldest other items leave if it outgrew the bound.
        """
        item_id = item.id  # type: ignore[union-attr]
        if item_id in self._items:
            item = _without_audio(item)
            size = item_size(item)
            self._items[item_id] = item
            self._bytes += size - self._sizes[item_id]
            self._sizes[item_id] = size
            while self._bytes > self.max_bytes and self._order[0] != item_id:
                self._forget(self._order.pop(0))
                self.evicted += 1

    def delete(self, item_id: str) -> None:
        self.get(item_id)
        self._order.remove(item_id)
        self._forget(item_id)

    def _forget(self, item_id: str) -> None:
        del self._items[item_id]
        self._bytes -= self._sizes.pop(item_id)

    def history(self) -> tuple[tuple[str, str], ...]:
        """``(role, text)`` pairs, oldest first, for ``TurnRequest.history``."""
        out: list[tuple[str, str]] = []
        for item_id in self._order:
            item = self._items[item_id]
            if isinstance(item, MessageItem):
                text = "".join(_part_text(p) for p in item.content)
                out.append((item.role, text))
            elif isinstance(item, FunctionCallItem):
                out.append(("assistant", f"[call {item.name}({item.arguments})]"))
            elif isinstance(item, FunctionCallOutputItem):
                out.append(("tool", item.output))
        return tuple(out)

    def last_user_text(self) -> str | None:
        """Text of the newest user message, if it has text."""
        for item_id in reversed(self._order):
            item = self._items[item_id]
            if isinstance(item, MessageItem) and item.role == "user":
                text = "".join(_part_text(p) for p in item.content)
                return text or None
        return None


_AUDIO_PARTS = (InputAudioPart, OutputAudioPart, AudioPart)


def _without_audio(item: ConversationItem) -> ConversationItem:
    """``item`` without the audio bytes of its content parts (the transcripts stay)."""
    content = getattr(item, "content", None)
    if not content or not any(isinstance(p, _AUDIO_PARTS) and p.audio is not None for p in content):
        return item
    parts = [
        msgspec.structs.replace(p, audio=None) if isinstance(p, _AUDIO_PARTS) and p.audio is not None else p
        for p in content
    ]
    return msgspec.structs.replace(item, content=parts)


def _part_text(part: object) -> str:
    if isinstance(part, InputTextPart | OutputTextPart):
        return part.text
    if isinstance(part, InputAudioPart | OutputAudioPart):
        return part.transcript or ""
    return ""
