"""What a run needs around its program: the job dir and its lock, run info, metrics files,
progress, the watchdog and stack dumps, stop requests, distributed start-up and supervision.
"""
