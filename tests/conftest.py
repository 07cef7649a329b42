import os
import sys

# The pure-Python oracle lives beside the tests, not in the package.
sys.path.insert(0, os.path.dirname(__file__))
