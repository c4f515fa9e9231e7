"""The agent's tools: ``check``, ``submit``, the workspace helpers (`worktree`) and their local
SQLite store of submissions. Imported only by the CLI (``python -m grader check|submit``) and the
agent's kit; it runs in the agent's environment, never inside a sandboxed child."""
