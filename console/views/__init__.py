"""The operator console's pages, one module per area of the console:
dashboard, queues, topics, messages, blacklist, dead_letters, audit. Views
stay thin: a selector for the data, a form for input, a broker service for
every change, and the page's named partial for htmx swaps. Every form also
works as a plain post. What they share (typed requests, rendering, roles,
errors, not-found) is in ``common``."""
