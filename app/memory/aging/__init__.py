"""What happens to a user's memories as they age, at idle time, never on a chat's path:
forgetting over a capacity (:mod:`.forgetting`, weighed by :mod:`.value`), with an archive
the user can put memories back from. The Manager's idle-time work (consolidation) is the
learning layer's (:mod:`app.memory.learning.idle`), which runs this too."""
