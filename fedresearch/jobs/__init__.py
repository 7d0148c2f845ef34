"""Jobs: every research task runs as one, kept with its frames and report (in this process or Redis)
so a client can leave and come back; the process's runtime, its stop, retention and webhooks."""
