pytest_plugins = ["tests.support.servers", "tests.support.broker", "tests.support.spark"]
