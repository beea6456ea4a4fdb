"""The tool executor actor: runs the supervisor's `ToolJob`s.

Tools are at most once: a job is never re-run here, and a job whose executor
dies is failed by the supervisor, not re-issued.
"""
