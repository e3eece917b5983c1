"""Room aliases, directory visibility and public room lists: local, and other servers'
through the remote directory under ADR-0079's budget."""
