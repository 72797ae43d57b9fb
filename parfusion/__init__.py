"""PARFusion: the command line, the embedded launcher, the service table and the generated contracts."""

__version__ = "0.1.0"
