"""Scoped long-term memory (docs/delegation-memory.md): what the model remembers across
conversations, each
memory in one scope — a user, a conversation, a channel or a team — and never recalled
where its scope does not reach.

    scopes.py   which scopes a run sees and may write to (the privacy rule, in one place)
    service.py  `Memory`: remember, recall (with `memory_miss` logging), list, forget
    recall.py   recalled memories quoted as data; the optional automatic recall
    tools.py    the `remember` and `recall` tools
    command.py  the `/memory` command

The rows live in the store (`core.store.MemoryStore`, both backends).
"""
