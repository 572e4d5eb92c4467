"""Learning from past conversations: a chat export read (`memproxy learn`, ``POST
/v1/memories/learn``) and queued as Manager jobs dated when its messages were said.

- export.py: what a conversation is once read (its current branch's user and assistant messages,
  oldest first, each with its own time), and :class:`~.export.BadExport`, naming the place;
- read.py: the file read whole and checked before anything is queued, and which format it is;
- openwebui.py and chatgpt.py: the two formats, Open WebUI's chat export and ChatGPT's
  ``conversations.json``;
- plan.py: a conversation cut into jobs of the size the worker expects, each dated;
- queue.py: the jobs written, a conversation in one transaction, idempotent on resend (turn
  fingerprints, as chats use), and a learn run's progress.
"""
