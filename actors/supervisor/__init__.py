"""The supervisor actor: sessions, their histories, and the turn loop of each.

The loop's decisions are plain functions (`turn`, `history`, `request`) over
plain data; `session` drives them through an I/O interface that the actor
(`actor`) implements with workers and events, and that tests implement with
fakes.
"""
