"""The HTMX dashboard: the cockpit a person opens first after ``make run``.

It reads every service on a short poll, renders panels server-side (htmx swaps the partials),
drives the guided demo through the services' real APIs and asks the allocator for what-if
previews without applying them.
"""
