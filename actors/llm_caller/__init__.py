"""The llm caller actor: calls the model for the supervisor's `LlmJob`s.

It owns everything model-specific: the `anthropic` SDK (or an in-process
scripted model), retries with backoff, streaming with an idle watchdog, and
batching of deltas. SDK exceptions never leave this package.
"""
