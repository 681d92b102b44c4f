pytest_plugins = ["tests.support.bytecode", "tests.support.servers", "tests.support.broker", "tests.support.spark"]
