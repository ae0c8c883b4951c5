"""What every poolserve process shares: configuration, boot hand-off, logging, the wire protocol, the load board.

Torch-free by rule (pyproject's banned-api lint covers this folder); the process roles import
from here, and nothing here imports from them.
"""
