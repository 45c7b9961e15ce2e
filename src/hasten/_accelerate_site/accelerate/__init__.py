# Found first on sys.path only while hasten's accelerate switch is on (`hasten.as_accelerate`,
# `hasten launch --as-accelerate`): the import of `accelerate` in any process, children included,
# turns the switch on there and hands back hasten itself. The real package is never imported.
import sys

from hasten.process.aliasing import install

install()
sys.modules[__name__] = sys.modules["hasten"]
