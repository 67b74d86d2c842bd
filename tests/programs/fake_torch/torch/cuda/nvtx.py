_depth = [0]


def range_push(msg):
    _depth[0] += 1
    return _depth[0] - 1


def range_pop():
    _depth[0] -= 1
    return _depth[0]
