package dsync_test

const childEnv = "DSYNC_TEST_CHILD"

func runChild(role string) int { return 2 }
