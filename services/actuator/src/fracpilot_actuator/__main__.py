from fracpilot_actuator.service import main

main()
