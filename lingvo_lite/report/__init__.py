"""The run report: a job directory read into plain data, its plots, and its HTML pages.
"""
