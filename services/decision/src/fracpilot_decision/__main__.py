from fracpilot_decision.service import main

main()
